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
from ar2dlm.pipeline.runs import resolve_run
from ar2dlm.provenance import library_versions, read_json, write_json
from ar2dlm.training.distributed import barrier, process_group
from ar2dlm.training.trainer import train_run

REPO = Path(__file__).resolve().parents[1]


def timed_run(run, teacher, corpus, steps, skip, work: Path, launch: dict, pg) -> dict | None:
    """``steps`` steps of ``run`` with the planned ``launch`` on every process of the job, in a fresh
    ``work`` folder (shared by the processes); rank 0's medians over the steps after ``skip``."""
    run = copy.deepcopy(run)
    run["training"].update({"steps": steps, "checkpoint_every": 10**9, "warmup_steps": 1})
    if pg.main:
        shutil.rmtree(work, ignore_errors=True)  # a killed attempt's final checkpoint would skip every step
    barrier(pg)
    train_run(run, teacher, corpus, work, seed=0, preset="bench", model_name="bench", launch=launch)
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


def gpu_mfu(config, steps: int = 20, peak_tflops: float = 989.0):
    """bf16 tokens/s and MFU of a random Qwen3-0.6B-shaped model at length 2048 (CUDA only)."""
    from transformers import Qwen3ForCausalLM

    from ar2dlm.core.conventions import Conventions
    from ar2dlm.plan.memory import QWEN3_SHAPES
    from ar2dlm.training.objectives import diffusion_terms

    cfg = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"].qwen3_config(max_position_embeddings=4096)
    out = {}
    for name in (config["bench"]["train_runs"]["baseline"], config["bench"]["train_runs"]["aligned"]):
        run = resolve_run(config, name)
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(cfg).cuda()
        teacher = Qwen3ForCausalLM(cfg).cuda().eval().requires_grad_(False) if run["align"] else None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        conv = Conventions(
            attention=run["attention"],
            shift=run["shift"],
            mask_token_id=151669,
            eos_token_id=151643,
            pad_token_id=151643,
            block_size=run["block_size"],
        )
        B, T = 4, 2048
        ids = torch.randint(0, 151000, (B, T), device="cuda")
        valid, plens = torch.ones_like(ids), torch.zeros(B, dtype=torch.long, device="cuda")
        gen = torch.Generator(device="cuda").manual_seed(0)
        times = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = sum(diffusion_terms(model, teacher, run, conv, ids, valid, plens, gen).values())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        step_s = statistics.median(times[3:])
        n = sum(p.numel() for p in model.parameters())
        flops = 6 * n * B * T + 12 * cfg.num_hidden_layers * cfg.hidden_size * B * T * T  # + teacher fwd if aligned
        if teacher is not None:
            flops += 2 * n * B * T
        out[name] = {
            "tokens_per_s": round(B * T / step_s),
            "step_s": round(step_s, 4),
            "mfu": round(flops / step_s / (peak_tflops * 1e12), 4),
            "params": n,
        }
        del model, teacher, opt
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
    config = merge_preset({"preset": a.preset}, REPO / "config")
    launch = json.loads(a.launch)
    work = Path(a.out).with_suffix(".work")
    with process_group(planned_gpus=launch.get("gpus", 0)) as pg:  # every process of the job times each run
        roles = config["bench"]["train_runs"]  # baseline, aligned, frozen
        runs = {
            name: timed_run(resolve_run(config, name), a.teacher, a.corpus, a.steps, a.skip, work / name, launch, pg)
            for name in roles.values()
        }
        main = pg.main
    if not main:
        return
    shutil.rmtree(work, ignore_errors=True)
    gpu = gpu_mfu(config) if torch.cuda.is_available() else "no CUDA GPU here: MFU not measured"
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
