"""Sweep DPO settings on a preset's AR teacher, or AR-MAP's baselines on a DLM: which lr, beta,
steps, LoRA or full weights align (held-out preference accuracy up) without harm (pass@1 kept on
every benchmark AR-MAP evaluates).

    python benchmarks/dpo_sweep.py RESULTS_DIR [--preset tiny] [--domain all] \\
        [--setting '{"lr": 5e-4}' ...] [--out dpo_sweep.json]
    python benchmarks/dpo_sweep.py RESULTS_DIR --dlm mdlm --objective simpo --domain code ...

RESULTS_DIR is a run's ``results/`` folder holding the teacher (or, with ``--dlm RUN``, that
conversion's seed-0 checkpoint), its preference pairs and the evaluations' problem files
(``snakemake all_armap`` builds them). Each ``--setting`` is merged over the preset's ``armap.dpo``
(with ``--dlm``: ``armap.dlm_<objective>``, the direct baseline: dpo with VRPO's estimator, or
simpo); without any, the built-in grid below runs. For the base model and for every setting it
prints and records:

- ``reward_acc``: the held-out implicit-reward accuracy, the share of pairs whose margin
  beta * (log-ratio of y_w - log-ratio of y_l) against the base is positive (TRL's for the teacher:
  0 for the teacher itself, whose margins are all 0; for a DLM a tie counts half, so 0.5);
- ``rank_acc``: the share of held-out pairs whose chosen response the model finds more likely
  than the rejected one (log p(y_w|x) > log p(y_l|x)), the teacher's own preference accuracy
  (causal models only: a DLM's would rank two Monte Carlo ELBOs);
- each AR-MAP benchmark's headline score and its retention (score / the base model's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ar2dlm.pipeline.resolved import Resolved

REPO = Path(__file__).resolve().parents[1]

# lr x steps x (full | LoRA r 8): around AR-MAP's own recipe (LoRA DPO) and the tiny preset's old
# full-weight setting (lr 5e-4, 60 steps), which cut the teacher's pass@1 from 0.81 to 0.21
GRID = [
    {"lr": 5e-4, "steps": 60},
    {"lr": 5e-5, "steps": 60},
    {"lr": 1e-5, "steps": 60},
    {"lr": 5e-5, "steps": 120},
    {"lr": 1e-3, "steps": 60, "lora": {"r": 8, "alpha": 16}},
    {"lr": 2e-4, "steps": 60, "lora": {"r": 8, "alpha": 16}},
]

# a direct baseline on a DLM (--dlm): the preset's own setting, lr down and up, and LoRA (AR-MAP's recipe)
DLM_GRID = [{}, {"lr": 5e-5}, {"lr": 1e-3}, {"lr": 3e-4, "lora": {"r": 8, "alpha": 16}}]


def rank_accuracy(model_dir, rows: list[dict], max_length: int) -> float:
    """Share of pairs whose chosen response the causal model at ``model_dir`` scores higher."""
    import torch

    from ar2dlm.armap.dpo import encode_pairs
    from ar2dlm.core.likelihood import ar_loglikelihood
    from ar2dlm.core.models import load_model

    model, tok, _, _ = load_model(model_dir, dtype=torch.float32)
    wins, loses = encode_pairs(tok, rows, max_length)
    lw, ll = (torch.tensor(ar_loglikelihood(model, p, tok.pad_token_id)) for p in (wins, loses))
    return float((lw > ll).float().mean())


def scores(resolved: Resolved, model_dir, benches: list[str], seed: int, limit: int | None) -> dict[str, float]:
    from ar2dlm.evaluation.suite import run_benchmark
    from ar2dlm.pipeline import layout

    out = {}
    for bench in benches:
        benchmark = resolved.benchmarks[bench]
        spec = benchmark.settings
        if limit is not None:
            spec["limit"] = limit or None  # 0: every held-out item
        inputs = layout.benchmark_inputs(bench, benchmark.kind.reads(spec))
        res = run_benchmark(bench, spec, model_dir, inputs, seed=seed)
        out[bench] = round(benchmark.headline_value(res), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a run's results/ folder (teacher, preference pairs, problem files)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", default=None, help="the teacher (default: the preset's first model)")
    ap.add_argument("--dlm", default=None, help="a conversion run: sweep the direct baseline on its seed-0 DLM")
    ap.add_argument("--objective", choices=["dpo", "simpo"], default="dpo", help="--dlm: armap.dlm_<objective>")
    ap.add_argument("--domain", default="all", help="a preference domain, or all of armap.domains together")
    ap.add_argument("--setting", action="append", type=json.loads, help="JSON merged over armap.dpo (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--benchmarks", nargs="+", help="benchmarks to score (default: armap.evals of the domain)")
    ap.add_argument("--limit", type=int, default=None, help="items per benchmark (0: all; default: the preset's)")
    ap.add_argument("--out", type=Path, default=Path("dpo_sweep.json"))
    a = ap.parse_args()
    out_path = a.out.resolve()

    from ar2dlm.armap.dpo import DpoJob, train_dpo
    from ar2dlm.armap.pipeline import preference_rows
    from ar2dlm.core.models import final_checkpoint
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve
    from ar2dlm.provenance import deep_merge, write_json

    resolved = resolve(merge_preset({"preset": a.preset}, REPO / "config"))
    config = resolved.config
    if not a.results.is_dir():
        ap.error(f"{a.results} is not a folder")
    os.chdir(a.results.resolve().parent)  # result paths are relative to the run's working directory
    from ar2dlm.pipeline import layout

    model = a.model or next(iter(config["models"]))
    armap = config["armap"]
    if a.dlm:
        manifest = Path(layout.conversion_manifest(model, a.dlm, 0))
        if not manifest.is_file():
            ap.error(f"no conversion at {manifest.resolve()}: run `snakemake {manifest}` first")
        if f"dlm_{a.objective}" not in armap:
            ap.error(f"the preset {a.preset} has no armap.dlm_{a.objective}")
        teacher = Path(final_checkpoint(manifest))  # the base model the baseline trains
        base = {**armap[f"dlm_{a.objective}"], "objective": a.objective}
    else:
        teacher = Path(layout.teacher_dir(model))
        if not teacher.is_dir():
            ap.error(f"no teacher at {teacher.resolve()}: run `snakemake {teacher}` first")
        base = armap["dpo"]
    domains = armap["domains"] if a.domain == "all" else [a.domain]
    benches = a.benchmarks or armap["evals"][a.domain]
    train = preference_rows([layout.preference_file(d, "train") for d in domains], base["train_pairs"])
    held = preference_rows([layout.preference_file(d, "eval") for d in domains], base["eval_pairs"])

    t0 = time.time()
    ref = scores(resolved, teacher, benches, a.seed, a.limit)

    def rank(m):
        return None if a.dlm else rank_accuracy(m, held, base["max_length"])

    rows = [{"setting": a.dlm or "teacher", "reward_acc": 0.0, "rank_acc": rank(teacher)}]
    rows[0] |= ref
    settings = a.setting or (DLM_GRID if a.dlm else GRID)
    for own in settings:
        cfg = deep_merge(base, own)
        work = Path(tempfile.mkdtemp(prefix="dpo_sweep_"))
        try:
            t1 = time.time()
            prov = train_dpo(DpoJob(teacher, train, held, work / "model", cfg, a.seed, domains))
            row = {"setting": json.dumps(own, sort_keys=True), "reward_acc": prov["reward_accuracy"]}
            row["rank_acc"] = rank(work / "model")
            for b, v in scores(resolved, work / "model", benches, a.seed, a.limit).items():
                row[b] = v
                row[f"{b}_kept"] = round(v / ref[b], 3) if ref[b] else None
            row["wall_s"] = round(time.time() - t1, 1)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows.append(row)
        print(json.dumps(row), flush=True)
        record = {"preset": a.preset, "domain": a.domain, "limit": a.limit, "base": base, "dlm": a.dlm}
        write_json(out_path, record | {"rows": rows})
    import pandas as pd

    print(pd.DataFrame(rows).to_markdown(index=False))
    print(f"{out_path}: {len(settings)} settings in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
