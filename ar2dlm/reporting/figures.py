"""Study figures, one function per figure kind (``FIGURE_KINDS``: the schema's ``studies.*.figure``
names, a test ties the two), and one way to write a figure (PDF and PNG) without a display.

Each kind draws on one axis from the study's evaluations on its first benchmark."""

from __future__ import annotations

import os
from functools import partial

import pandas as pd

from ..pipeline import layout
from ..pipeline.resolved import Resolved
from ..provenance import read_json
from .captions import seeds_phrase
from .tables import Evaluated, recipe_flops, recipe_tokens, study_evaluations


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, pdf_path, png_path) -> None:
    fig.tight_layout()
    fig.savefig(pdf_path)
    fig.savefig(png_path, dpi=150)
    pyplot().close(fig)


def teacher_line(ax, resolved: Resolved, study: str, metric: str) -> None:
    """The AR teacher's score on the figure's first benchmark as a dashed line (one per model, where its
    evaluation has the plotted metric)."""
    st = resolved.studies[study]
    for model in st.models:
        value = read_json(layout.eval_path(st.evals[0], model, "teacher"))["metrics"].get(metric)
        if value is not None:
            label = "AR teacher" + (f" ({model})" if len(st.models) > 1 else "")
            ax.axhline(value, color="black", linewidth=0.8, linestyle="--", label=label)


def metric_curve(ax, resolved: Resolved, study: str, data: list[Evaluated], *, against: str) -> None:
    """A metric against the alignment weight lambda (one line per model) or against the training
    step (one line per model and run; pass@10 where measured: adaptation speed)."""
    first = resolved.studies[study].evals[0]
    metrics = next(d.result["metrics"] for d in data if d.benchmark == first)
    preferred = ("base_pass@10",) if against == "steps" else ()
    kind = resolved.benchmarks[first].kind
    metric = next(m for m in (*preferred, *kind.metrics) if m in metrics)
    rows = []
    for d in data:
        if d.benchmark != first:
            continue
        align = resolved.run(d.run)["align"]
        x = (align["lambda"] if align else 0.0) if against == "lambda" else d.step
        rows.append({"model": d.model, "run": d.run, "x": x, "seed": d.seed, "y": d.result["metrics"][metric]})
    df = pd.DataFrame(rows)
    group = ["model"] if against == "lambda" else ["model", "run"]
    for key, part in df.groupby(group):
        agg = part.groupby("x")["y"].agg(["mean", "std"]).fillna(0.0).reset_index()
        ax.errorbar(
            agg["x"],
            agg["mean"],
            yerr=agg["std"],
            marker="o",
            capsize=3,
            label=" ".join(key) if isinstance(key, tuple) else key,
        )
    teacher_line(ax, resolved, study, metric)
    if against == "lambda":
        ax.set_xscale("symlog", linthresh=1)
        # lambda is never negative: keep the symlog axis's mirrored side (a -10^0 tick) out of view,
        # and the largest lambda's marker inside the frame
        ax.set_xlim(-0.5, max(df["x"].max() * 1.5, 1.5))
    ax.set_xlabel("alignment weight lambda" if against == "lambda" else "training step")
    ax.set_ylabel(f"{first}: {metric}")


SPEED_LABELS = {
    "tokens_per_s": "tokens / s",
    "tokens_per_step": "tokens per step",
    "speedup": "tokens/s over the AR teacher's",
}


def speed_curve(ax, resolved: Resolved, study: str, data: list[Evaluated], *, xkey: str) -> None:
    """Accuracy against decoding speed (tokens/s, tokens per step, or ``speedup``: tokens/s over
    the AR teacher's on the same tasks), one line per run and block size over the decoding
    thresholds (each labelled), at each run's final step; the AR teacher as a star."""
    st = resolved.studies[study]
    first = st.evals[0]
    for model in st.models:
        teacher = read_json(layout.eval_path(first, model, "teacher"))["rows"][0]
        for r in st.runs:
            final = max((d.step for d in data if d.model == model and d.run == r), default=None)
            rows = [
                row
                for d in data
                if d.model == model and d.run == r and d.benchmark == first and d.step == final
                for row in d.result["rows"]
            ]
            if not rows:
                continue
            df = pd.DataFrame(rows)
            if xkey == "speedup":
                df["speedup"] = df["tokens_per_s"] / teacher["tokens_per_s"]
            df = df.groupby(["threshold", "block_size"], dropna=False)[[xkey, "base_pass@1"]].mean()
            for block, part in df.reset_index().groupby("block_size", dropna=False):
                part = part.sort_values(xkey)
                ax.plot(part[xkey], part["base_pass@1"], marker="o", label=f"{r} (block {int(block)})")
                if xkey == "speedup":
                    for _, p in part.iterrows():
                        ax.annotate(
                            f"{p['threshold']:g}",
                            (p[xkey], p["base_pass@1"]),
                            fontsize=6,
                            textcoords="offset points",
                            xytext=(3, 3),
                        )
        tx = 1.0 if xkey == "speedup" else teacher[xkey]
        ax.scatter([tx], [teacher["base_pass@1"]], marker="*", s=120, color="black", label="AR teacher")
    ax.set_xlabel(SPEED_LABELS[xkey] + (" (point labels: threshold)" if xkey == "speedup" else ""))
    ax.set_ylabel(f"{first}: base_pass@1")


def budget_curve(ax, resolved: Resolved, study: str, data: list[Evaluated]) -> None:
    """Held-out NLL per token against the training tokens each run's checkpoint had seen (its
    manifest; every checkpoint where the study evaluates them all), mean over seeds; one line per
    run and metric."""
    rows = []
    for d in data:
        manifest = read_json(layout.conversion_manifest(d.model, d.run, d.seed))
        # a checkpoint before the last (checkpoints: all) has seen its share of the run's own tokens
        own = manifest["tokens"] * (1 - d.step / manifest["steps"])
        tokens = recipe_tokens(manifest) - own
        for m, v in d.result["metrics"].items():
            if m.startswith("nll_per_token"):
                rows.append({"run": d.run, "step": d.step, "tokens": tokens, "metric": m, "y": v})
    df = pd.DataFrame(rows).groupby(["metric", "run", "step"]).mean().reset_index()
    for (m, run), part in df.groupby(["metric", "run"]):
        part = part.sort_values("tokens")
        ax.plot(part["tokens"], part["y"], marker="o", label=f"{run} {m}")
    for m in df["metric"].unique():
        teacher_line(ax, resolved, study, m)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out NLL per token (ELBO bound)")


def flops_curve(ax, resolved: Resolved, study: str, data: list[Evaluated]) -> None:
    """Quality against training compute (OPDLM's efficiency axis): each run's headline metric
    against the training FLOPs its manifest counts, mean +- sd over seeds, one point per run."""
    first = resolved.studies[study].evals[0]
    metric = resolved.benchmarks[first].headline_metric
    rows = [
        {
            "run": d.run,
            "model": d.model,
            "flops": recipe_flops(read_json(layout.conversion_manifest(d.model, d.run, d.seed))),
            "y": d.result["metrics"][metric],
        }
        for d in data
        if d.benchmark == first
    ]
    df = pd.DataFrame(rows).groupby(["model", "run"]).agg(flops=("flops", "mean"), y=("y", "mean"), sd=("y", "std"))
    for (model, run), r in df.fillna(0.0).iterrows():
        ax.errorbar([r["flops"]], [r["y"]], yerr=[r["sd"]], marker="o", capsize=3, label=f"{model} {run}")
    if df["flops"].max() > 10 * df["flops"].min():  # budgets an order of magnitude apart
        ax.set_xscale("log")
    else:  # an equal-FLOPs comparison: a linear axis keeps its close ticks readable
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
        ax.margins(x=0.5 if df["flops"].nunique() == 1 else 0.1)
    teacher_line(ax, resolved, study, metric)
    ax.set_xlabel("training FLOPs (counted: student, teacher, rollouts)")
    ax.set_ylabel(f"{first}: {metric}")


def retention_curve(ax, resolved: Resolved, study: str, data: list[Evaluated]) -> None:
    """How much of the AR teacher a recipe keeps against its training budget: each run's headline
    score as a share of the teacher's (mean +- sd over seeds) against the training tokens its
    checkpoint had seen, one line per method (its runs are the budgets), each point labelled with
    the epochs of its training rows it saw (rows trained on / rows the run's token_rows hold)."""
    first = resolved.studies[study].evals[0]
    metric = resolved.benchmarks[first].headline_metric
    teacher = {m: read_json(layout.eval_path(first, m, "teacher"))["metrics"][metric] for m in {d.model for d in data}}
    runs = {d.run for d in data}
    held = {r: read_json(os.path.join(resolved.conversion_corpus(r), "index.json"))["rows"] for r in runs}
    rows = []
    for d in data:
        if d.benchmark != first or not teacher[d.model]:
            continue
        run = resolved.run(d.run)
        manifest = read_json(layout.conversion_manifest(d.model, d.run, d.seed))
        rows.append(
            {
                "recipe": f"{d.model} {run['method']} ({run['attention']})",
                "tokens": recipe_tokens(manifest) * d.step / manifest["steps"],
                "epochs": d.step * run["training"]["batch_size"] / held[d.run],
                "y": d.result["metrics"][metric] / teacher[d.model],
                "run": d.run,
                "step": d.step,
            }
        )
    if not rows:  # a teacher that scores 0 (the smoke preset's) leaves no share to draw
        ax.text(0.5, 0.5, f"the AR teacher scores 0 on {first}: no share to show", ha="center", transform=ax.transAxes)
        return
    df = (
        pd.DataFrame(rows)
        .groupby(["recipe", "run", "step"])
        .agg(tokens=("tokens", "mean"), epochs=("epochs", "mean"), y=("y", "mean"), sd=("y", "std"))
    )
    for recipe, part in df.fillna(0.0).reset_index().groupby("recipe"):
        part = part.sort_values("tokens")
        ax.errorbar(part["tokens"], part["y"], yerr=part["sd"], marker="o", capsize=3, label=recipe)
        for _, p in part.iterrows():
            where = (p["tokens"], p["y"])
            ax.annotate(f"{p['epochs']:.2g} ep", where, fontsize=6, textcoords="offset points", xytext=(3, -8))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="AR teacher")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens (point labels: epochs of the run's training rows)")
    ax.set_ylabel(f"{first}: {metric}\nas a share of the AR teacher's")


FIGURE_KINDS = {
    "lambda": partial(metric_curve, against="lambda"),
    "steps": partial(metric_curve, against="steps"),
    "throughput": partial(speed_curve, xkey="tokens_per_s"),
    "tokens_per_step": partial(speed_curve, xkey="tokens_per_step"),
    "speedup": partial(speed_curve, xkey="speedup"),
    "budget": budget_curve,
    "flops": flops_curve,
    "retention": retention_curve,
}


def study_figure(resolved: Resolved, study: str, pdf_path, png_path) -> None:
    kind = resolved.studies[study].spec["figure"]
    if kind not in FIGURE_KINDS:
        raise ValueError(f"unknown figure kind {kind!r} (known: {', '.join(FIGURE_KINDS)})")
    plt = pyplot()
    data = study_evaluations(resolved, study)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    FIGURE_KINDS[kind](ax, resolved, study, data)
    # how many seeds each point averages: a run's evaluations at one step
    points = pd.DataFrame([(d.model, d.run, d.step, d.seed) for d in data], columns=["model", "run", "step", "seed"])
    counts = points.drop_duplicates().groupby(["model", "run", "step"])["seed"].count().tolist()
    ax.set_title(f"{study} ({resolved.preset} preset): {seeds_phrase(counts)}", fontsize=8)
    if ax.get_legend_handles_labels()[1]:  # a figure with nothing drawn says why instead
        ax.legend(fontsize=6)
    save(fig, pdf_path, png_path)


def effect_curves_figure(curves: dict[str, dict[int, list[float]]], pdf_path, png_path) -> None:
    """Each budget-sensitive claim's effect (mean paired difference, +- sd over seeds) against the
    training step, with the zero line the verdicts read against."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for claim, curve in curves.items():
        agg = (
            pd.DataFrame([{"step": k, "d": d} for k, ds in curve.items() for d in ds])
            .groupby("step")["d"]
            .agg(["mean", "std"])
            .fillna(0.0)
            .reset_index()
        )
        ax.errorbar(agg["step"], agg["mean"], yerr=agg["std"], marker="o", capsize=3, label=claim)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel("effect (a - b, paired by seed)")
    if curves:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no claim's study evaluates every checkpoint", ha="center", transform=ax.transAxes)
    save(fig, pdf_path, png_path)
