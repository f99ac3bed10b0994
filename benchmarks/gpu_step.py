"""One GPU, real Qwen3 widths (random init): bf16 training steps per method, tokens/s, MFU and peak
memory against the planner; prints one JSON line per case and a Markdown table. ``benchmarks/gpu_check.py``
runs its steps for the memory check (and compares flex attention with dense masks).

    python benchmarks/gpu_step.py [--shapes 0.6b 1.7b] [--seq 2048] [--rows 2] [--peak-tflops 989]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from train_memory import case_run, random_qwen3  # noqa: E402  (the tiny preset's runs, resized; the model)

HUB = {"0.6b": "Qwen/Qwen3-0.6B-Base", "1.7b": "Qwen/Qwen3-1.7B-Base"}
METHOD_RUNS = {"mdlm": "mdlm", "repr_align": "ra", "efficient_dlm": "ed", "opdlm (off-policy)": "opd_off"}


def build(shape, attn: str, dtype=torch.float32):
    torch.manual_seed(0)
    model = random_qwen3(vars(shape)).to(dtype).cuda()
    model.set_attn_implementation(attn)
    return model


def step_case(shape, run, rows, seq, attn, steps=4):
    from ar2dlm.core.conventions import Conventions
    from ar2dlm.methods.registry import objective_for
    from ar2dlm.plan.memory import Launch, estimate, peak, step_flops
    from ar2dlm.training.data import MicroBatch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build(shape, attn)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    objective = objective_for(
        run, Conventions(run["attention"], run["shift"], shape.vocab - 1, 1, 2, run["block_size"]), 0
    )
    teacher = None
    if objective.needs_teacher:
        t = build(shape, "sdpa", torch.bfloat16)  # the trainer loads a bf16 run's teacher in bf16
        teacher = (t if objective.teacher_head else t.model).eval().requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, shape.vocab - 1, (rows, seq), generator=gen)
    prompt = seq // 2 if run["distill"] is not None else 0
    mb = MicroBatch(ids, torch.ones_like(ids), torch.full((rows,), prompt), torch.arange(rows), 1, 0).to("cuda")
    times = []
    for step in range(steps):
        torch.cuda.synchronize()
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = sum(objective.terms(model, teacher, mb, step, gen).values())
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.time() - t0)
    dt = sorted(times[1:])[len(times[1:]) // 2]
    run = {**run, "training": {**run["training"], "batch_size": rows, "dtype": "bf16"}}  # as the steps ran
    flops = step_flops(shape, run, True)
    est = peak(estimate(shape, run, Launch(1, 1, rows, True, False)))
    del model, teacher, opt
    return {
        "tokens_per_s": objective.trained_tokens(mb, 0) / dt,
        "step_s": dt,
        "tflops": flops / dt / 1e12,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "planner_gb": est / 1e9,
        "loss": float(loss),
    }


def main():
    from ar2dlm.plan.memory import QWEN3_SHAPES

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["0.6b", "1.7b"])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200: 989)")
    args = ap.parse_args()
    rows = []
    for name in args.shapes:
        shape = QWEN3_SHAPES[HUB[name]]
        for method, run_name in METHOD_RUNS.items():
            run = case_run(run_name, args.rows, args.seq, True)
            r = {"shape": name, "method": method, **step_case(shape, run, args.rows, args.seq, "flex_attention")}
            r["mfu"] = r["tflops"] / args.peak_tflops
            print(json.dumps(r), flush=True)
            rows.append(r)
    print("\n| shape | method | tokens/s | MFU | peak GB | planner GB |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['shape']} | {r['method']} | {r['tokens_per_s']:.0f} | {r['mfu']:.1%} | {r['peak_gb']:.1f} "
            f"| {r['planner_gb']:.1f} |"
        )


if __name__ == "__main__":
    main()
