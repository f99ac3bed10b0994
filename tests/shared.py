"""What several tests (and ``benchmarks/gpu_check.py``) build the same way: the tiny Qwen3 shape of a
test teacher and torchrun's command line. Plain Python (no pytest), so that a benchmark imports it."""

import json
import sys
from pathlib import Path

TINY_ARCH = {  # a 2-layer, 32-wide Qwen3: a teacher built in milliseconds
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
}


def torchrun(nproc: int = 2) -> list[str]:
    """The command that starts ``nproc`` local processes with torchrun; the script and its arguments follow."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def smoke_job(root, run: dict, out, seed: int = 0, **job):
    """A smoke conversion job of ``run`` reading ``root``/teacher and ``root``/corpus.jsonl into ``out``."""
    from ar2dlm.training.trainer import TrainJob

    root = Path(root)
    return TrainJob(
        run, root / "teacher", root / "corpus.jsonl", out, seed=seed, preset="smoke", model_name="tiny", **job
    )


def convert_argv(run: dict, teacher, corpus, out, preset: str = "smoke", model: str = "tiny") -> list[str]:
    """``ar2dlm.training.convert_run``'s command line: ``run`` from ``teacher`` on ``corpus`` into ``out``
    (its train.json), seed 0."""
    return [
        "--settings",
        json.dumps(run),
        "--teacher",
        str(teacher),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--seed",
        "0",
        "--preset",
        preset,
        "--model",
        model,
    ]


def dpo_argv(source: tuple[str, str], train, held_out, settings: dict, out, domain: str = "math") -> list[str]:
    """``ar2dlm.armap.dpo_run``'s command line: DPO of ``source`` (``("--model", folder)`` or
    ``("--manifest", train.json)``) on one preference file of ``domain``, seed 0."""
    flag, path = source
    return [
        flag,
        str(path),
        "--train",
        str(train),
        "--domains",
        domain,
        "--eval",
        str(held_out),
        "--settings",
        json.dumps(settings),
        "--seed",
        "0",
        "--out",
        str(out),
    ]
