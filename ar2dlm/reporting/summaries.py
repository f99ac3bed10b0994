"""Run summary of what the chosen preset has produced so far."""

from __future__ import annotations

import pandas as pd

from ..core.models import load_conventions
from ..pipeline.layout import parse_eval_path, preference_domain
from ..provenance import read_json


def run_summary(
    preset: str,
    models: list[str],
    eval_paths: list[str],
    teacher_dirs: list[str],
    corpus_manifest: str,
    preference_paths: list[str],
) -> tuple[str, dict]:
    rows = []
    for model, eval_path, tdir in zip(models, eval_paths, teacher_dirs):
        ev, info = read_json(eval_path), load_conventions(tdir)
        data = info.get("data", {})
        rows.append(
            {
                "model": model,
                "source": info["method"],
                "parameters": info["parameters"],
                "pretrain steps": data.get("steps"),
                "pretrain tokens": data.get("tokens_seen"),
                "train tok/s": data.get("tokens_per_s"),
                "held-out loss (code)": round(ev["heldout_loss"]["code"], 4),
                "held-out loss (math)": round(ev["heldout_loss"]["math"], 4),
                "pass@1 (base)": round(ev["base_pass@1"], 4),
                "pass@1 (plus)": round(ev["plus_pass@1"], 4),
                "eval tasks": ev["n_tasks"],
            }
        )
    table = pd.DataFrame(rows)
    corpus = read_json(corpus_manifest)
    prefs = {preference_domain(p): sum(1 for _ in open(p)) for p in preference_paths}
    summary = {
        "preset": preset,
        "teachers": rows,
        "corpus": {k: corpus[k] for k in ("subset", "stream")},
        "preference_eval_pairs": prefs,
    }
    md = [
        f"# ar2dlm run summary (preset: {preset})",
        "",
        "Numbers measured by this run at the preset's scale; none of them is a paper number.",
        "",
        "## AR teachers",
        "",
        "Held-out loss: mean next-token cross-entropy on completion tokens of the held-out suites. pass@1: greedy "
        "decoding on the held-out code suite (unseen pairings of operations), scored by evalplus; base = the task's "
        "base tests, plus = base and extra tests.",
        "",
        table.to_markdown(index=False),
        "",
        "## Data",
        "",
        f"- corpus subset: {corpus['subset']}",
        f"- corpus stream: {corpus['stream']}",
        f"- held-out preference pairs per domain: {prefs}",
        "",
    ]
    return "\n".join(md), summary


def eval_rows(paths: list[str]) -> pd.DataFrame:
    """Every scalar metric of every evaluation JSON in long form (benchmark, model, run, seed,
    variant, metric, value), with the AR teacher's value for the same benchmark and metric beside
    it. ``variant`` is the checkpoint (``step_<k>``) or a model derived from it (``armap_<domain>_<merge>``,
    ``dlm_dpo_<domain>``); the teacher and its DPO'd versions are runs ``teacher`` and
    ``teacher_dpo_<domain>``. Throughput curves (one row per threshold and block) stay in their JSONs."""
    rows = []
    for path in paths:
        where = parse_eval_path(path)
        for metric, value in read_json(path)["metrics"].items():
            if metric != "sample_len":
                rows.append({**where, "metric": metric, "value": float(value)})
    df = pd.DataFrame(rows, columns=["benchmark", "model", "run", "seed", "variant", "metric", "value"])
    teacher = df[df.run == "teacher"][["benchmark", "model", "metric", "value"]].rename(columns={"value": "teacher"})
    return df.merge(teacher, on=["benchmark", "model", "metric"], how="left")


def eval_summary(preset: str, paths: list[str]) -> tuple[str, pd.DataFrame]:
    """Mean and spread over seeds of every metric at each run's evaluated steps, teacher beside."""
    df = eval_rows(paths)
    conv = df[~df.run.str.startswith("teacher")]
    agg = (
        conv.groupby(["benchmark", "model", "run", "variant", "metric"])
        .agg(mean=("value", "mean"), std=("value", "std"), seeds=("seed", "nunique"), teacher=("teacher", "first"))
        .reset_index()
    )
    agg["std"] = agg["std"].fillna(0.0)
    md = [
        f"# Evaluations (preset: {preset})",
        "",
        "Every metric of every evaluated model: mean and standard deviation over seeds, the AR teacher's value "
        "under the same harness beside it (its DPO'd versions are listed under their own names). Measured at this "
        "preset's scale; none is a paper number.",
        "",
    ]
    teachers = df[df.run.str.startswith("teacher")]
    for bench, part in agg.groupby("benchmark"):
        md += [f"## {bench}", "", part.drop(columns="benchmark").round(4).to_markdown(index=False), ""]
        t = teachers[teachers.benchmark == bench][["model", "run", "metric", "value"]]
        md += [t.round(4).to_markdown(index=False), ""]
    return "\n".join(md), df
