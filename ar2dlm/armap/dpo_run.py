"""Command line of one DPO job (AR-MAP's DPO of the teacher, or its DPO-on-the-DLM baseline), what
the ``dpo_teacher`` and ``dlm_dpo`` rules launch: plain ``python -m`` for one process (TRL's
DPOTrainer, LoRA or full), ``torchrun`` for full DPO sharded over several GPUs (the project's FSDP2
trainer), as the planner decides. A job planned in segments stops with exit status 75 after a
checkpoint, and its retry resumes."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..core.models import device_problem, final_checkpoint
from ..provenance import log_to
from ..training.distributed import process_group
from ..training.torchrun import SEGMENT_DONE
from .dpo import DpoJob, train_dpo, train_dpo_sharded
from .pipeline import preference_rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="the model folder to train (the AR teacher)")
    src.add_argument("--manifest", help="a conversion's train.json: its final checkpoint is trained")
    ap.add_argument("--train", nargs="+", required=True, help="preference files, one per domain")
    ap.add_argument("--domains", nargs="+", required=True, help="the domain of each --train file, in order")
    ap.add_argument("--eval", nargs="+", required=True)
    ap.add_argument("--settings", required=True, help="the dpo section of the config as JSON")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--job-log", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--launch",
        default="{}",
        help="the plan's launch choices as JSON (activation_checkpointing, shard_teacher, stop_after_hours)",
    )
    a = ap.parse_args(argv)
    if len(a.domains) != len(a.train):
        ap.error(f"--domains names {len(a.domains)} domains for {len(a.train)} --train files")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if a.job_log:
        log_to(a.job_log if rank == 0 else f"{a.job_log}.rank{rank}", a.threads)
    cfg = json.loads(a.settings)
    model = a.model or final_checkpoint(a.manifest)
    train, held = preference_rows(a.train, cfg["train_pairs"]), preference_rows(a.eval, cfg["eval_pairs"])
    launch = json.loads(a.launch)
    if problem := device_problem(launch.get("gpus", 0)):  # before any model loads
        sys.exit(f"no GPU for this process: {problem}")
    job = DpoJob(model, train, held, a.out, cfg, a.seed, a.domains, launch)
    if world > 1:
        with process_group():  # each process on its own GPU, the group destroyed at the end
            result = train_dpo_sharded(job)
    else:
        result = train_dpo(job)
    if result is not None and result.get("stopped_at") is not None:
        print(
            f"stopped after step {result['stopped_at']} of {result['steps']} with a checkpoint, before the job's "
            "time limit; its retry resumes from it",
            file=sys.stderr,
        )
        sys.exit(SEGMENT_DONE)


if __name__ == "__main__":
    main()
