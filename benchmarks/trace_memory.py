"""Every conversion job of a preset traced at its real shapes and planned world size, without a GPU,
against the memory planner's estimate (``ar2dlm.plan.trace``):

    python benchmarks/trace_memory.py [--configfile config/presets/paper.yaml] [--jobs qwen3_0_6b/mdlm ...]
        [--out results/bench/trace_memory.json]

Prints, per job (every conversion, and AR-MAP's gamma search and one-GPU DPO on each model: TRL's
trainer, the teacher's and the DLM's), the launch, rank 0's traced peak by part, the plan's estimate
and its error, and the headroom the larger of the two leaves on the config's GPU; jobs whose step
cannot be traced are listed with why.
Each trace runs in a process of its own (a process group per world size), one after another.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ar2dlm.pipeline.checks import checked_config  # noqa: E402
from ar2dlm.pipeline.config import read_config_file  # noqa: E402

TOLERANCE = 0.15  # a plan within 15% of the traced peak


def trace_in_process(configfile: str, job: str) -> dict:
    """One job's trace in a child process (torch's fake process group is one per process)."""
    script = (
        "import json, sys\nfrom dataclasses import asdict\nfrom ar2dlm.pipeline.checks import checked_config\n"
        "from ar2dlm.pipeline.config import read_config_file\nfrom ar2dlm.plan.trace import trace_job\n"
        "resolved = checked_config(read_config_file(sys.argv[1]), sys.argv[3])\n"
        "print(json.dumps(asdict(trace_job(resolved, sys.argv[2]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, configfile, job, str(REPO / "config")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=str(REPO)),
    )
    if proc.returncode:
        return {"job": job, "error": proc.stderr.strip().splitlines()[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from ar2dlm.plan.memory import plan_jobs
    from ar2dlm.plan.one_gpu import plan_one_gpu_jobs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", default=str(REPO / "config" / "presets" / "paper.yaml"))
    ap.add_argument("--jobs", nargs="*", help="model/run jobs (default: every conversion job of the config)")
    ap.add_argument("--out", help="write the traces as JSON here")
    args = ap.parse_args(argv)
    resolved = checked_config(read_config_file(args.configfile), REPO / "config")
    plans = {p.job: p for p in plan_jobs(resolved)}
    # AR-MAP's one-GPU jobs with a training or scoring step: the gamma search, DPO through TRL
    armap = [
        j.job
        for j in plan_one_gpu_jobs(resolved)
        if j.job.startswith("gamma_search/") or (j.job.startswith(("dpo_teacher/", "dlm_dpo/")) and j.gpus == 1)
    ]
    jobs = args.jobs or [*plans, *armap]
    gpu_gb = resolved.config["cluster"]["gpu_memory_gb"]
    rows, skipped = [], []
    for job in jobs:
        traced = trace_in_process(args.configfile, job)
        if "error" in traced:
            skipped.append(f"{job}: trace failed: {traced['error']}")
            continue
        traced["error_vs_plan"] = traced["planned_gb"] / traced["peak_gb"] - 1
        traced["headroom_gb"] = gpu_gb - max(traced["planned_gb"], traced["peak_gb"])
        launch = plans[job].launch if job in plans else None
        traced["launch"] = f"{launch.nodes} x {launch.gpus_per_node}" if launch else "1 x 1"
        rows.append(traced)
        print(f"{job}: traced {traced['peak_gb']:.1f} GB, planned {traced['planned_gb']:.1f} GB", flush=True)
    print(
        f"\nRank 0's peak of one training step (a gamma search: one scoring forward) traced at the real shapes "
        f"(fake tensors, fake process group) against the planner, on {gpu_gb} GB GPUs\n"
    )
    print("| job | launch | rows/GPU | traced GB | planned GB | plan vs traced | headroom GB | traced parts (GB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        parts = ", ".join(f"{k} {v}" for k, v in r["parts"].items() if v)
        print(
            f"| {r['job']} | {r['launch']} | {r['rows']} | {r['peak_gb']:.1f} | {r['planned_gb']:.1f} | "
            f"{r['error_vs_plan']:+.0%} | {r['headroom_gb']:.1f} | {parts} |"
        )
    outside = [r["job"] for r in rows if abs(r["error_vs_plan"]) > TOLERANCE]
    print(
        f"\n{len(rows) - len(outside)} of {len(rows)} traced jobs within {TOLERANCE:.0%} of their plan"
        + (f"; outside: {', '.join(outside)}" if outside else "")
    )
    for line in skipped:
        print(f"not traced: {line}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"gpu_memory_gb": gpu_gb, "traced": rows, "not_traced": skipped}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
