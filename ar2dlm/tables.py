"""The papers' tables and figures, rebuilt from the evaluation JSONs of the chosen preset.

Every study (config ``studies``) becomes one table: a row per run (its final checkpoint), a column
per benchmark metric as mean +- standard deviation over the study's seeds, the AR teacher under
the same harness as the last row. Numbers a paper reports (``config/reported.yaml``) are listed
under the table with their source and model, never mixed into the measured rows. A study with a
``figure`` kind also gets a figure. Every artifact states the preset, models and seeds it came from.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .provenance import read_json
from .runs import checkpoint_steps_of, final_checkpoint, resolve_run, study_seeds

FIGURE_KINDS = ("lambda", "steps", "throughput", "tokens_per_step", "budget")
# The metrics a table shows per benchmark kind (others stay in the evaluation JSONs).
TABLE_METRICS = {"code": ("base_pass@1", "plus_pass@1", "base_pass@10", "plus_pass@10"), "math": ("exact_match",),
                 "harness": ("acc", "exact_match"), "embeddings": ("main_score",),
                 "likelihood": ("nll_per_token_code", "nll_per_token_math")}


def eval_file(results: str, benchmark: str, model: str, run: str, seed: int | None = None, step: int | None = None) -> Path:
    base = Path(results) / "eval" / benchmark / model
    return base / "teacher.json" if run == "teacher" else base / run / f"seed{seed}" / f"step_{step}.json"


def study_models(config: dict, spec: dict) -> list[str]:
    models = spec.get("models")
    return models or sorted({m for r in spec["runs"] for m in resolve_run(config, r)["models"]})


def study_inputs(config: dict, study: str, results: str = "results") -> list[str]:
    """Every evaluation JSON a study's table and figure read (what its rule depends on)."""
    spec = config["studies"][study]
    paths = []
    for model in study_models(config, spec):
        for e in spec["evals"]:
            paths.append(eval_file(results, e, model, "teacher"))
            for r in spec["runs"]:
                run = resolve_run(config, r)
                if model not in run["models"]:
                    continue
                steps = checkpoint_steps_of(run) if spec.get("checkpoints") == "all" else [run["training"]["steps"]]
                paths += [eval_file(results, e, model, r, s, k) for s in study_seeds(config, spec, r) for k in steps]
    if spec.get("figure") == "budget" or spec.get("training_columns"):
        paths += [Path(results) / "models" / m / r / f"seed{s}" / "train.json" for m in study_models(config, spec)
                  for r in spec["runs"] for s in study_seeds(config, spec, r) if m in resolve_run(config, r)["models"]]
    return sorted({str(p) for p in paths})


def mean_sd(values: list[float], fmt: str = ".3f") -> str:
    s = pd.Series(values, dtype=float)
    return f"{s.mean():{fmt}}" if len(s) == 1 else f"{s.mean():{fmt}} ± {s.std():{fmt}}"


def parameter_count(model_dir) -> int:
    """Parameters of a saved checkpoint, read from its safetensors headers (no weights loaded)."""
    from safetensors import safe_open

    n = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                n += math.prod(st.get_slice(k).get_shape())
    return n


def training_columns(manifests: list[Path]) -> dict:
    """Training tokens, tokens/s (summed step time, across resumptions) and FLOPs of the trained
    model's forward and backward passes (6 x parameters x tokens; a teacher's forward passes for
    alignment or distillation targets are not counted), mean +- sd over seeds."""
    runs = [read_json(m) for m in manifests]
    params = [parameter_count(final_checkpoint(m)) for m in manifests]
    return {"training tokens": mean_sd([r["tokens"] for r in runs], fmt=".0f"),
            "training tokens/s": mean_sd([r["tokens"] / r["train_seconds"] for r in runs], fmt=".0f"),
            "training FLOPs (6ND)": mean_sd([6 * n * r["tokens"] for n, r in zip(params, runs)], fmt=".3g")}


def study_table(config: dict, study: str, results: str = "results") -> tuple[pd.DataFrame, dict]:
    """(table, context): one row per (model, run) at its final step and the teacher per model."""
    spec = config["studies"][study]
    benches = config["eval"]["benchmarks"]
    rows, raw = [], []
    for model in study_models(config, spec):
        for r in [*spec["runs"], "teacher"]:
            if r != "teacher" and model not in resolve_run(config, r)["models"]:
                continue
            row = {"model": model, "run": r}
            seeds = [None] if r == "teacher" else study_seeds(config, spec, r)
            step = None if r == "teacher" else resolve_run(config, r)["training"]["steps"]
            for e in spec["evals"]:
                kind = benches[e]["kind"]
                results_ = [read_json(eval_file(results, e, model, r, s, step)) for s in seeds]
                if kind == "throughput":
                    best = [max(res["rows"], key=lambda x: x.get("base_pass@1", 0)) for res in results_]
                    row[f"{e}: best base_pass@1"] = mean_sd([b.get("base_pass@1", 0) for b in best])
                    row[f"{e}: tokens/s at best"] = mean_sd([b["tokens_per_s"] for b in best])
                    continue
                for metric in TABLE_METRICS[kind]:
                    vals = [res["metrics"][metric] for res in results_ if metric in res["metrics"]]
                    if vals:
                        row[f"{e}: {metric}"] = mean_sd(vals)
                        raw += [{"model": model, "run": r, "seed": s, "benchmark": e, "metric": metric, "value": v}
                                for s, v in zip(seeds, vals)]
            if spec.get("training_columns") and r != "teacher":
                row.update(training_columns([Path(results) / "models" / model / r / f"seed{s}" / "train.json" for s in seeds]))
            row["seeds"] = "-" if r == "teacher" else ", ".join(map(str, seeds))
            rows.append(row)
    context = {"study": study, "preset": config["preset"], "models": study_models(config, spec),
               "seeds": sorted({s for r in spec["runs"] for s in study_seeds(config, spec, r)}), "raw": raw}
    return pd.DataFrame(rows), context


def reported_rows(reported: dict, study: str, preset: str) -> pd.DataFrame:
    """The papers' numbers for a study, with source (shown beside ours, never as ours)."""
    rows = [{**r, "note": "paper number" + ("" if preset == "paper" else f", not at the {preset} preset's scale")}
            for r in reported.get(study, [])]
    return pd.DataFrame(rows)


def study_header(context: dict) -> str:
    return (f"Study `{context['study']}`, preset `{context['preset']}`, models {', '.join(context['models'])}, "
            f"seeds {', '.join(map(str, context['seeds']))}. Measured by this pipeline; mean ± standard deviation "
            "over seeds at each run's final checkpoint; the AR teacher under the same harness.")


def write_table(table: pd.DataFrame, title: str, header: str, preset: str, md_path, csv_path, tex_path,
                reported: pd.DataFrame | None = None) -> None:
    """One table as Markdown (title, provenance header, the papers' numbers under it), CSV and LaTeX."""
    shown = table.fillna("-")  # cells a row has no value for (the teacher's training columns)
    md = [f"# {title}", "", header, "", shown.to_markdown(index=False), ""]
    if reported is not None and len(reported):
        md += ["Reported in the papers (with source):", "", reported.to_markdown(index=False), ""]
    Path(md_path).write_text("\n".join(md))
    table.assign(preset=preset).to_csv(csv_path, index=False)
    caption = f"{title}. {header}".replace("`", "").replace("±", "$\\pm$").replace("_", "\\_")
    Path(tex_path).write_text(shown.to_latex(index=False, caption=caption, label=f"tab:{title}")
                              .replace("±", "$\\pm$"))


def _curve_frame(config, study, results):
    """Long rows (model, run, seed, step, benchmark, result JSON) of a study's evaluations."""
    spec = config["studies"][study]
    out = []
    for model in study_models(config, spec):
        for r in spec["runs"]:
            run = resolve_run(config, r)
            if model not in run["models"]:
                continue
            steps = checkpoint_steps_of(run) if spec.get("checkpoints") == "all" else [run["training"]["steps"]]
            for e in spec["evals"]:
                for s in study_seeds(config, spec, r):
                    for k in steps:
                        out.append((model, r, s, k, e, read_json(eval_file(results, e, model, r, s, k))))
    return out


def study_figure(config: dict, study: str, pdf_path, png_path, results: str = "results") -> None:
    from .figures import pyplot, save

    plt = pyplot()

    spec = config["studies"][study]
    kind = spec["figure"]
    data = _curve_frame(config, study, results)
    first = spec["evals"][0]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    if kind in ("lambda", "steps"):
        metrics = next(d[5]["metrics"] for d in data if d[4] == first)
        preferred = ("base_pass@10",) if kind == "steps" else ()  # adaptation speed: pass@10 against steps
        metric = next(m for m in (*preferred, *TABLE_METRICS[config["eval"]["benchmarks"][first]["kind"]])
                      if m in metrics)
        rows = []
        for model, r, s, k, e, res in data:
            if e != first:
                continue
            align = resolve_run(config, r)["align"]
            x = (align["lambda"] if align else 0.0) if kind == "lambda" else k
            rows.append({"model": model, "run": r, "x": x, "seed": s, "y": res["metrics"][metric]})
        df = pd.DataFrame(rows)
        group = ["model"] if kind == "lambda" else ["model", "run"]
        for key, part in df.groupby(group):
            agg = part.groupby("x")["y"].agg(["mean", "std"]).fillna(0.0).reset_index()
            ax.errorbar(agg["x"], agg["mean"], yerr=agg["std"], marker="o", capsize=3,
                        label=" ".join(key) if isinstance(key, tuple) else key)
        if kind == "lambda":
            ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("alignment weight lambda" if kind == "lambda" else "training step")
        ax.set_ylabel(f"{first}: {metric}")
    elif kind in ("throughput", "tokens_per_step"):
        xkey = "tokens_per_s" if kind == "throughput" else "tokens_per_step"
        for model in study_models(config, spec):
            for r in spec["runs"]:
                rows = [row for m, rr, s, k, e, res in data if m == model and rr == r and e == first for row in res["rows"]]
                if not rows:
                    continue
                df = pd.DataFrame(rows).groupby(["threshold", "block_size"], dropna=False)[[xkey, "base_pass@1"]].mean()
                for block, part in df.reset_index().groupby("block_size", dropna=False):
                    part = part.sort_values(xkey)
                    ax.plot(part[xkey], part["base_pass@1"], marker="o", label=f"{r} (block {int(block)})")
            teacher = read_json(eval_file(results, first, model, "teacher"))["rows"][0]
            ax.scatter([teacher[xkey]], [teacher["base_pass@1"]], marker="*", s=120, color="black", label="AR teacher")
        ax.set_xlabel("tokens / s" if kind == "throughput" else "tokens per step")
        ax.set_ylabel(f"{first}: base_pass@1")
    elif kind == "budget":
        rows = []
        for model, r, s, k, e, res in data:
            tokens = read_json(Path(results) / "models" / model / r / f"seed{s}" / "train.json")["tokens"]
            for m, v in res["metrics"].items():
                if m.startswith("nll_per_token"):
                    rows.append({"run": r, "tokens": tokens, "metric": m, "y": v})
        df = pd.DataFrame(rows).groupby(["metric", "run"]).mean().reset_index()
        for m, part in df.groupby("metric"):
            part = part.sort_values("tokens")
            ax.plot(part["tokens"], part["y"], marker="o", label=m)
        ax.set_xscale("log")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("held-out NLL per token (ELBO bound)")
    else:
        raise ValueError(f"unknown figure kind {kind!r} (known: {', '.join(FIGURE_KINDS)})")
    seeds = sorted({d[2] for d in data})
    ax.set_title(f"{study} ({config['preset']} preset, seeds {', '.join(map(str, seeds))})", fontsize=8)
    ax.legend(fontsize=6)
    save(fig, pdf_path, png_path)
