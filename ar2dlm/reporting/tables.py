"""The papers' tables and figures, rebuilt from the evaluation JSONs of the chosen preset.

Every study (config ``studies``) becomes one table: a row per run (its final checkpoint), a column
per benchmark metric as mean +- standard deviation over the study's seeds, the AR teacher under
the same harness as the last row. Numbers a paper reports (``config/reported.yaml``) are listed
under the table with their source and model, never mixed into the measured rows. A study with a
``figure`` kind also gets a figure (``figures``). Every artifact states the preset, models and seeds it came from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from ..pipeline import layout
from ..pipeline.resolved import Resolved
from ..provenance import code_commit, read_json, settings_hash


def study_inputs(resolved: Resolved, study: str) -> list[str]:
    """Every evaluation JSON a study's table and figure read (what its rule depends on)."""
    st = resolved.studies[study]
    members = st.members
    paths = [layout.eval_path(e, model, "teacher") for model in st.models for e in st.evals]
    paths += [
        layout.eval_path(e, m.model, m.run, s, k) for m in members for e in st.evals for s in m.seeds for k in m.steps
    ]
    # every table shows each run's training tokens and FLOPs from its manifest
    paths += [layout.conversion_manifest(m.model, m.run, s) for m in members for s in m.seeds]
    if st.spec.get("figure") == "retention":  # the epochs it labels: each run's token_rows folder
        paths += [resolved.conversion_corpus(m.run) for m in members]
    return sorted(set(paths))


def mean_sd(values: list[float], fmt: str = ".3f") -> str:
    s = pd.Series(values, dtype=float)
    return f"{s.mean():{fmt}}" if len(s) == 1 else f"{s.mean():{fmt}} ± {s.std():{fmt}}"


def recipe_flops(manifest: dict) -> float:
    """A run's training FLOPs, with those of the runs it was started from (a staged recipe)."""
    return manifest["flops"].get("with_init", manifest["flops"]["total"])


def recipe_tokens(manifest: dict) -> int:
    return manifest.get("tokens_with_init", manifest["tokens"])


# Scores a converted model keeps of its AR teacher's (higher is better, 0 at worst): the study tables
# show each as a share of the teacher's beside it
RETAINED = ("base_pass@1", "plus_pass@1", "base_pass@10", "plus_pass@10", "exact_match", "acc", "main_score")


def retention(values: list[float], teacher: float | None) -> str:
    """Mean score over seeds as a share of the teacher's (``-`` where the teacher scores 0)."""
    if not teacher:
        return "-"
    return f"{pd.Series(values, dtype=float).mean() / teacher:.2f}"


def training_columns(runs: list[dict], speed: bool) -> dict:
    """Training tokens and training FLOPs as the trainer counted them (student forward and
    backward, the teacher's forward, on-policy rollouts: ``Objective._count``; a staged run's
    include its earlier stages), and with ``speed`` tokens/s of the run's own stage (summed step
    time, across resumptions), mean +- sd over seeds, from the runs' manifests."""
    out = {
        "training tokens": mean_sd([recipe_tokens(r) for r in runs], fmt=".0f"),
        "training FLOPs": mean_sd([recipe_flops(r) for r in runs], fmt=".3g"),
    }
    if speed:
        out["training tokens/s"] = mean_sd([r["tokens"] / r["train_seconds"] for r in runs], fmt=".0f")
    return out


def study_table(resolved: Resolved, study: str) -> tuple[pd.DataFrame, dict]:
    """(table, context): one row per (model, run) at its final step and the teacher per model."""
    st = resolved.studies[study]
    members = st.members
    rows, commits, machines = [], set(), []
    for model in st.models:
        teacher = {e: read_json(layout.eval_path(e, model, "teacher")) for e in st.evals}
        for m in [m for m in members if m.model == model] + [None]:
            run, seeds = ("teacher", [None]) if m is None else (m.run, m.seeds)
            # the hash each of the run's checkpoints and evaluations records as its settings
            row = {
                "model": model,
                "run": run,
                "run settings sha256": "-"
                if m is None
                else settings_hash({k: v for k, v in resolved.conversion_settings(run).items() if k != "name"}),
            }
            for e in st.evals:
                kind = resolved.benchmarks[e].kind
                if m is None:
                    results = [teacher[e]]
                else:
                    results = [read_json(layout.eval_path(e, model, run, s, m.final_step)) for s in seeds]
                commits |= {r.get("provenance", {}).get("commit", "unrecorded") for r in results}
                machines += [("evaluation", r) for r in results]
                if kind.rows:  # one row per decoding setting: the most accurate one
                    metric = kind.metrics[0]
                    best = [max(res["rows"], key=lambda x: x.get(metric, 0)) for res in results]
                    row[f"{e}: best {metric}"] = mean_sd([b.get(metric, 0) for b in best])
                    row[f"{e}: tokens/s at best"] = mean_sd([b["tokens_per_s"] for b in best])
                    continue
                for metric in kind.metrics:
                    vals = [res["metrics"][metric] for res in results if metric in res["metrics"]]
                    if vals:
                        row[f"{e}: {metric}"] = mean_sd(vals)
                        if m is not None and metric in RETAINED:
                            row[f"{e}: {metric} kept"] = retention(vals, teacher[e]["metrics"].get(metric))
            if m is not None:
                manifests = [read_json(layout.conversion_manifest(model, run, s)) for s in seeds]
                row.update(training_columns(manifests, speed=bool(st.spec.get("training_columns"))))
                machines += [("training", r) for r in manifests]
            row["seeds"] = "-" if m is None else ", ".join(map(str, seeds))
            rows.append(row)
    context = {
        "study": study,
        "preset": resolved.preset,
        "models": list(st.models),
        "seeds": sorted({s for m in members for s in m.seeds}),
        "eval_commits": commits,
        "machines": machine_note(machines),
    }
    return pd.DataFrame(rows), context


def reported_rows(reported: dict, study: str, preset: str) -> pd.DataFrame:
    """The papers' numbers for a study, with source (shown beside ours, never as ours)."""
    rows = [
        {**r, "note": "paper number" + ("" if preset == "paper" else f", not at the {preset} preset's scale")}
        for r in reported.get(study, [])
    ]
    return pd.DataFrame(rows)


def study_header(context: dict) -> str:
    return (
        f"Study `{context['study']}`, preset `{context['preset']}`, models {', '.join(context['models'])}, "
        f"seeds {', '.join(map(str, context['seeds']))}. Measured by this pipeline; mean ± standard deviation "
        "over seeds at each run's final checkpoint; the AR teacher under the same harness."
    )


def machine_note(results: list[tuple[str, dict]]) -> str:
    """Where a table's numbers were computed, from the machine facts each (role, result) records:
    ``AMD EPYC (AVX2 kernels): training fp32, evaluation fp32`` (``dtype: auto`` resolved there)."""
    seen: dict[str, dict[str, set]] = {}
    for role, result in results:
        m = result.get("versions", {}).get("machine") or {}
        where = m.get("cuda") or f"{m.get('cpu', 'unrecorded CPU')} ({m.get('kernels', 'unrecorded')} kernels)"
        seen.setdefault(where, {}).setdefault(role, set()).add(m.get("dtype", "dtype unrecorded"))
    return "; ".join(
        f"{where}: " + ", ".join(f"{role} {'/'.join(sorted(d))}" for role, d in roles.items())
        for where, roles in seen.items()
    )


def provenance_footer(
    eval_commits: set[str] | None = None, settings: dict | None = None, machines: str | None = None
) -> str:
    """Which code made a table, which made its numbers, where they were computed and in which
    dtype (``machines``), and (``settings``) a hash of the settings it reads; each evaluation JSON
    records its own commit and settings hashes."""
    parts = [f"Table made at commit {code_commit()}"]
    if eval_commits:
        parts.append(f"its evaluations at {', '.join(sorted(eval_commits))}")
    if machines:
        parts.append(f"computed on {machines}")
    if settings is not None:
        parts.append(f"settings sha256 {settings_hash(settings)}")
    return "; ".join(parts) + "."


class TableText(NamedTuple):
    """A table's words: its title, the header under it (preset, runs, seeds, what the cells are)
    and the provenance footer (default: this checkout's)."""

    title: str
    header: str
    footer: str | None = None


class TableFiles(NamedTuple):
    """Where a table goes: Markdown, CSV and LaTeX."""

    md: str | Path
    csv: str | Path
    tex: str | Path


def write_table(
    table: pd.DataFrame, text: TableText, files: TableFiles, preset: str, reported: pd.DataFrame | None = None
) -> None:
    """One table as Markdown (title, provenance header, the papers' numbers under it, the provenance
    footer), CSV (with the preset and the footer's commit) and LaTeX."""
    title, header, footer = text.title, text.header, text.footer or provenance_footer()
    shown = table.fillna("-")  # cells a row has no value for (the teacher's training columns)
    md = [f"# {title}", "", header, "", shown.to_markdown(index=False), ""]
    if reported is not None and len(reported):
        md += ["Reported in the papers (with source):", "", reported.to_markdown(index=False), ""]
    Path(files.md).write_text("\n".join(md + [footer, ""]))
    numeric_table(table).assign(preset=preset, commit=code_commit()).to_csv(files.csv, index=False)
    caption = latex_escape(f"{title}. {header} {footer}".replace("`", ""))
    label = "tab:" + re.sub(r"[^A-Za-z0-9:.-]", "-", title)
    latex = shown.to_latex(index=False, escape=True, caption=caption, label=label)
    Path(files.tex).write_text(latex.replace("±", "$\\pm$"))


_LATEX_SPECIAL = {c: "\\" + c for c in "&%$#_{}"} | {"~": "\\textasciitilde{}", "^": "\\^{}", "\\": "\\textbackslash{}"}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (``±`` becomes ``$\\pm$``)."""
    return "".join(_LATEX_SPECIAL.get(c, c) for c in text).replace("±", "$\\pm$")


def _number(cell):
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def numeric_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table as numbers for a notebook: each ``mean ± sd`` column split into ``<column> mean``
    and ``<column> sd`` (sd empty for one seed), every number a float, ``-`` empty, and the seeds
    counted (``n seeds``); other text as it is."""
    out = {}
    for col in table.columns:
        cells = table[col].tolist()
        if col == "seeds":  # a list of seeds, kept as text (a one-seed "0" is no number), and counted
            out[col] = [str(c) for c in cells]
            out["n seeds"] = [None if c == "-" else len(str(c).split(",")) for c in cells]
            continue
        parts = [str(c).split(" ± ") if isinstance(c, str) else [c] for c in cells]
        values = [p for p, c in zip(parts, cells) if not (pd.isna(c) or c == "-")]
        if values and all(_number(p[0]) is not None and all(_number(x) is not None for x in p) for p in values):
            out[f"{col} mean"] = [None if c == "-" or pd.isna(c) else _number(p[0]) for p, c in zip(parts, cells)]
            if any(len(p) == 2 for p in values):
                out[f"{col} sd"] = [_number(p[1]) if len(p) == 2 else None for p in parts]
            continue
        out[col] = cells
    return pd.DataFrame(out)


class Evaluated(NamedTuple):
    """One evaluation of a study: a run's checkpoint on a benchmark, and its result JSON."""

    model: str
    run: str
    seed: int
    step: int
    benchmark: str
    result: dict


def study_evaluations(resolved: Resolved, study: str) -> list[Evaluated]:
    """Every conversion evaluation of a study (each run, benchmark, seed and evaluated step)."""
    st = resolved.studies[study]
    return [
        Evaluated(m.model, m.run, s, k, e, read_json(layout.eval_path(e, m.model, m.run, s, k)))
        for m in st.members
        for e in st.evals
        for s in m.seeds
        for k in m.steps
    ]
