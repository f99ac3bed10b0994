"""Command line of one conversion run, what the convert rule launches: plain ``python -m`` for one
process (CPU or one GPU), ``torchrun --standalone --nproc_per_node=<GPUs>`` for several on one
node, ``srun`` + ``torchrun`` with c10d rendezvous across nodes; the trainer reads the torchrun
environment and shards the model with FSDP2. A job planned in segments stops with exit status 75
after a checkpoint, and its retry resumes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..provenance import log_to, write_json
from .torchrun import SEGMENT_DONE
from .tracking import exported
from .trainer import TrainJob, train_run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    # no option here is a prefix of a torchrun option (--run, --log would be taken as torchrun's --run-path, --log-dir)
    ap.add_argument("--settings", required=True, help="resolved run settings as JSON")
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="the run's manifest (train.json); checkpoints go beside it")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--job-log", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--launch",
        default="{}",
        help="launch choices as JSON (activation_checkpointing, shard_teacher, "
        "stop_after_hours): how the run uses its GPUs, not what it computes",
    )
    ap.add_argument(
        "--init-from",
        default=None,
        help="a staged run's source: the manifest (train.json) of the run whose final checkpoint it starts from",
    )
    ap.add_argument(
        "--tracking",
        default=None,
        help="experiment tracking as JSON: backend, project, directory (default: what the workflow exported)",
    )
    a = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    if a.job_log:
        log_to(a.job_log if rank == 0 else f"{a.job_log}.rank{rank}", a.threads)
    out = Path(a.out)
    info = train_run(
        TrainJob(
            json.loads(a.settings),
            a.teacher,
            a.corpus,
            out.parent,
            seed=a.seed,
            preset=a.preset,
            model_name=a.model,
            launch=json.loads(a.launch),
            tracking=json.loads(a.tracking) if a.tracking else exported(),
            init_from=a.init_from,
        )
    )
    if info["stopped_at"] is not None:
        print(
            f"stopped after step {info['stopped_at']} of {info['steps']} with a checkpoint, before the job's time "
            "limit; its retry resumes from it",
            file=sys.stderr,
        )
        sys.exit(SEGMENT_DONE)
    if rank == 0:  # the manifest is written last, once, when the run is complete
        write_json(out, info)


if __name__ == "__main__":
    main()
