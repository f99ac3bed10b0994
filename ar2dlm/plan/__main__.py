"""``python -m ar2dlm.plan --configfile FILE [--gpu-memory-gb N]``: the per-GPU memory of every
conversion job by part, the launch chosen for it (nodes, GPUs, rows per GPU, accumulation,
activation checkpointing, teacher placement) and its hours; then the GPU memory of every
evaluation and AR-MAP job kind (one GPU each), the hours of AR-MAP's jobs (DPO in resumable
segments) against their runtimes, and the tokenisation jobs of every token_rows folder (shard jobs,
worker processes, hours); exits 1 naming each job that does not fit (``ClusterPlan.unfit``, the
check the DAG build runs when the config sets ``cluster``)."""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from ..pipeline.checks import checked_config
from ..pipeline.config import ConfigError, read_config_file
from ..provenance import deep_merge
from .launch import plan_cluster
from .memory import GB
from .tokenize import TOKENS_PER_SECOND, plan_tokenize_jobs

REPO = Path(__file__).resolve().parents[2]
PARTS = ("parameters", "gradients", "optimizer", "teacher", "activations", "recompute", "logits", "masks", "rollout")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ar2dlm.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", default=str(REPO / "config" / "presets" / "paper.yaml"))
    ap.add_argument("--gpu-memory-gb", type=float, help="override cluster.gpu_memory_gb")
    args = ap.parse_args(argv)
    path = Path(args.configfile)
    if not path.is_file():
        sys.exit(f"--configfile {args.configfile}: no such file")
    try:  # the DAG build's checks: a typo in a key is refused here as there, naming the key
        resolved = checked_config(read_config_file(path), REPO / "config")
    except ConfigError as exc:
        sys.exit(f"{args.configfile}: invalid config: {exc}")
    if not resolved.config.get("cluster"):
        sys.exit(
            f"{args.configfile}: no `cluster:` section (gpu_memory_gb, gpus_per_node, max_nodes, gpu_tflops, "
            "mfu, runtime_hours) to plan for"
        )
    if args.gpu_memory_gb:
        override = {"cluster": {"gpu_memory_gb": args.gpu_memory_gb}}
        resolved = replace(resolved, config=deep_merge(resolved.config, override))
    c = resolved.config["cluster"]
    cluster = plan_cluster(resolved)
    plans = list(cluster.conversions.values())
    print(
        f"per-GPU peak (GB) of each conversion job on {c['gpu_memory_gb']:g} GB GPUs, {c['gpus_per_node']} per node; "
        f"hours at {c['mfu']:.0%} of {c['gpu_tflops']:g} TFLOP/s, {c['runtime_hours']:g} h per job\n"
    )
    print(
        "| job | nodes | GPUs | rows/GPU | accum | ckpt | teacher | "
        + " | ".join(PARTS)
        + " | peak | hours | segments |"
    )
    print("|" + "---|" * (len(PARTS) + 10))
    for p in plans:
        parts = " | ".join(f"{p.parts[k] / GB:.1f}" if k in p.parts else "-" for k in PARTS)
        if p.launch is None:
            print(f"| {p.job} | - | - | - | - | - | - | {parts} | {p.peak_gb:.0f} (does not fit) | - | - |")
            continue
        launch = p.launch
        ckpt = "yes" if launch.activation_checkpointing else "no"
        teacher = "sharded" if launch.shard_teacher else "replicated"
        print(
            f"| {p.job} | {launch.nodes} | {launch.gpus} | {launch.rows} | {p.accum} | {ckpt} "
            f"| {teacher} | {parts} | {p.peak_gb:.1f} | {p.hours:.1f} | {p.segments} |"
        )
    one_gpu = list(cluster.gpu_jobs.values())
    print(
        f"\nGPU memory (GB per GPU) of each evaluation and AR-MAP job on {c['gpu_memory_gb']:g} GB GPUs (the largest "
        "benchmark of each kind per model; full DPO sharded when one GPU cannot hold it); AR-MAP's hours in all, "
        "the jobs they take and the longest one against its runtime\n"
    )
    print("| job | GPUs | parts | peak | fits | hours | segments | longest / runtime (h) |\n" + "|---" * 8 + "|")
    for j in one_gpu:
        parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in j.parts.items() if v)
        t = j.time
        hours = f"{t.hours:.1f} | {t.segments} | {t.longest_hours:.1f} / {t.runtime_hours:g}" if t else "- | - | -"
        print(f"| {j.job} | {j.gpus} | {parts} | {j.peak_gb:.1f} | {'yes' if j.fits else 'no'} | {hours} |")
    bad = cluster.unfit()  # the DAG build's check
    print(
        f"\ntokenisation of each token_rows folder at {TOKENS_PER_SECOND / 1e6:g}M tokens/s per worker process, "
        "every shard job at once\n"
    )
    print(
        "| rows | tokens | shard jobs | workers per job | hours | memory (GB per job) | runtime limit (h) |\n"
        "|---|---|---|---|---|---|---|"
    )
    for t in plan_tokenize_jobs(resolved):
        print(
            f"| {t.source}/{t.selection}_len{t.seq_len} | {t.tokens / 1e9:.2f}B | {t.shards} | {t.workers} | "
            f"{t.hours:.1f} | {t.mem_mb / 1000:g} | {t.runtime_minutes / 60:.1f} |"
        )
    if bad:
        print("\njobs that do not fit:\n" + "\n".join(f"  {b}" for b in bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
