"""Run summary of what the chosen preset has produced so far."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .models import load_conventions
from .provenance import read_json


def run_summary(preset: str, models: list[str], eval_paths: list[str], teacher_dirs: list[str],
                corpus_manifest: str, preference_paths: list[str]) -> tuple[str, dict]:
    rows = []
    for model, eval_path, tdir in zip(models, eval_paths, teacher_dirs):
        ev, info = read_json(eval_path), load_conventions(tdir)
        data = info.get("data", {})
        rows.append({
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
        })
    table = pd.DataFrame(rows)
    corpus = read_json(corpus_manifest)
    prefs = {Path(p).parent.name: sum(1 for _ in open(p)) for p in preference_paths}
    summary = {"preset": preset, "teachers": rows, "corpus": {k: corpus[k] for k in ("subset", "stream")},
               "preference_eval_pairs": prefs}
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
