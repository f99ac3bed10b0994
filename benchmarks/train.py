"""Training throughput benchmark: tokens/s of conversion runs on one model, one machine.

    python benchmarks/train.py --teacher results/models/tiny/teacher --corpus results/data/corpus/subset.jsonl \
        --preset smoke --out results/bench/train.json [--manifests results/models/tiny/*/seed*/train.json]

Under the bench_train rule it runs with the planned launch of the bench model's largest timed run
(``--launch``: torchrun's processes, sharding, activation checkpointing), every process timing each
run and rank 0 writing the figures, each run's peak memory among them.

Figures: tokens/s with embeddings + MLP frozen over full training (REPR-ALIGN reports about 2x),
repr_align step time over mdlm step time, the wall time of each finished run (from the convert
stage's manifests), and, where a CUDA GPU is present, bf16 tokens/s and MFU of a randomly
initialised Qwen3-0.6B-shaped model at sequence length 2048 for mdlm and repr_align.
"""

import argparse
import copy
import json
import shutil
import statistics
import sys
from pathlib import Path

import torch

from ar2dlm.pipeline.config import merge_preset
from ar2dlm.pipeline.resolved import Resolved, resolve
from ar2dlm.provenance import library_versions, read_json, write_json
from ar2dlm.training.distributed import barrier, process_group
from ar2dlm.training.trainer import TrainJob, train_run

REPO = Path(__file__).resolve().parents[1]


def timed_run(run, teacher, corpus, steps, skip, work: Path, launch: dict, pg) -> dict | None:
    """``steps`` steps of ``run`` with the planned ``launch`` on every process of the job, in a fresh
    ``work`` folder (shared by the processes); rank 0's medians over the steps after ``skip``."""
    run = copy.deepcopy(run)
    run["training"].update({"steps": steps, "checkpoint_every": 10**9, "warmup_steps": 1})
    if pg.main:
        shutil.rmtree(work, ignore_errors=True)  # a killed attempt's final checkpoint would skip every step
    barrier(pg)
    train_run(TrainJob(run, teacher, corpus, work, seed=0, preset="bench", model_name="bench", launch=launch))
    if not pg.main:
        return None
    rows = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()][skip:]
    shutil.rmtree(work)
    return {
        "run": run["name"],
        "steps_timed": len(rows),
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 1),
        "step_s": round(statistics.median(r["step_s"] for r in rows), 5),
        "peak_gb": max(r.get("peak_allocated_gb", r.get("peak_rss_gb", 0)) for r in rows),
    }


def gpu_mfu(resolved: Resolved, rows: int = 4, seq: int = 2048, peak_tflops: float = 989.0) -> dict:
    """bf16 tokens/s and MFU of a randomly initialised Qwen3-0.6B-shaped model at length ``seq``, for
    the baseline and aligned runs (CUDA only): ``benchmarks/gpu_step.py``'s step, with the run's own
    objective and activation checkpointing, the planner's FLOPs and memory beside it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_step import step_case

    from ar2dlm.plan.memory import QWEN3_SHAPES

    shape = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"]
    out = {}
    roles = resolved.config["bench"]["train_runs"]
    for name in (roles["baseline"], roles["aligned"]):
        run = resolved.run(name).as_dict()
        run["training"].update({"seq_len": seq, "batch_size": rows, "grad_accum": 1, "activation_checkpointing": True})
        r = step_case(shape, run, rows, seq, "flex_attention", steps=20)
        out[name] = {
            "tokens_per_s": round(r["tokens_per_s"]),
            "step_s": round(r["step_s"], 4),
            "mfu": round(r["tflops"] / peak_tflops, 4),
            "peak_gb": round(r["peak_gb"], 2),
            "planner_gb": round(r["planner_gb"], 2),
        }
        torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the medians")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--manifests", nargs="*", default=[])
    ap.add_argument("--launch", default="{}", help="the planned launch as JSON (the bench_train rule's)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    resolved = resolve(merge_preset({"preset": a.preset}, REPO / "config"))
    config = resolved.config
    launch = json.loads(a.launch)
    work = Path(a.out).with_suffix(".work")
    with process_group(planned_gpus=launch.get("gpus", 0)) as pg:  # every process of the job times each run
        roles = config["bench"]["train_runs"]  # baseline, aligned, frozen
        runs = {
            name: timed_run(resolved.run(name).as_dict(), a.teacher, a.corpus, a.steps, a.skip, work / name, launch, pg)
            for name in roles.values()
        }
        main = pg.main
    if not main:
        return
    shutil.rmtree(work, ignore_errors=True)
    gpu = gpu_mfu(resolved) if torch.cuda.is_available() else "no CUDA GPU here: MFU not measured"
    baseline, aligned, frozen = (runs[roles[r]] for r in ("baseline", "aligned", "frozen"))
    result = {
        "runs": runs,
        "freeze_speedup": round(frozen["tokens_per_s"] / aligned["tokens_per_s"], 3),
        "repr_align_over_mdlm_step_time": round(aligned["step_s"] / baseline["step_s"], 3),
        # seconds of training steps per run, summed over every attempt (a resumed run's manifest
        # records only its last process in wall_seconds)
        "wall_seconds": {
            f"{m['model']}/{m['run']}/seed{m['seed']}": m.get("train_seconds", m["wall_seconds"])
            for m in map(read_json, a.manifests)
        },
        "gpu": gpu,
        "launch": launch,
        "threads": torch.get_num_threads(),
        "versions": library_versions(),
    }
    write_json(a.out, result)
    print(f"frozen embeddings+MLP / full training tokens/s: {result['freeze_speedup']}x (goal >= 2)")
    print(f"repr_align / mdlm step time: {result['repr_align_over_mdlm_step_time']} (goal <= 1.3)")
    for k, v in result["wall_seconds"].items():
        print(f"  {k}: {v} s")
    print("gpu:", json.dumps(result["gpu"]))


if __name__ == "__main__":
    sys.exit(main())
