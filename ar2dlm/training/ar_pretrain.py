"""Causal-LM pretraining of the tiny teacher on a packed token stream, through the training loop
every conversion runs in (``loop``), with the causal-LM objective (``causal_lm``)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from ..core.conventions import Conventions
from ..data.tokenization import encode_pair
from .causal_lm import CausalLM
from .distributed import ProcessGroup
from .loop import Loop, optimizer
from .steplog import StepLog


def pack_documents(docs: list[dict], tokenizer, seq_len: int, seed: int) -> torch.Tensor:
    """Shuffle documents, encode each (prompt and completion separately, end-of-text appended),
    concatenate and cut into rows of ``seq_len + 1`` tokens (inputs and next-token targets)."""
    docs = list(docs)
    random.Random(f"{seed}-pack").shuffle(docs)
    ids: list[int] = []
    for d in docs:
        p, c = encode_pair(tokenizer, d["prompt"], d["completion"])
        ids += p + c
    n_rows = len(ids) // (seq_len + 1)
    if n_rows == 0:
        raise ValueError(f"corpus of {len(ids)} tokens is shorter than one sequence of {seq_len + 1}")
    return torch.tensor(ids[: n_rows * (seq_len + 1)], dtype=torch.long).view(n_rows, seq_len + 1)


PRETRAIN_KEYS = ("steps", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip")  # and log_every (10)


def pretrain(model, train_rows: torch.Tensor, settings: dict, *, dtype: str, seed: int, log_path: str | Path) -> dict:
    """Train ``model`` in place on packed rows through the training loop with the causal-LM
    objective, on this process's CPU, with ``settings`` (a model's ``pretrain`` section:
    ``PRETRAIN_KEYS`` and ``log_every``); log every step to ``log_path`` (CSV for a .csv path, else
    JSON lines); return a summary."""
    torch.manual_seed(seed)
    training = {k: settings[k] for k in PRETRAIN_KEYS} | {"grad_accum": 1, "log_every": settings.get("log_every", 10)}
    steps, batch_size = training["steps"], training["batch_size"]
    conv = Conventions("causal", True, None, model.config.eos_token_id, model.config.pad_token_id)
    objective = CausalLM({}, conv, seed)
    objective.count_parameters(model, None)
    batches = objective.batches(train_rows, None, train_rows.shape[1] - 1, batch_size, seed)
    model.train()
    log = StepLog(log_path)
    loop = Loop(
        model,
        None,
        objective,
        optimizer(model, training),
        training,
        ProcessGroup(),
        dtype,
        torch.Generator().manual_seed(seed),
        log,
        "pretrain",
    )
    t0 = time.time()
    loop.run(batches)
    elapsed = time.time() - t0
    rows = log.rows()
    tokens = sum(r["tokens"] for r in rows)
    return {
        "steps": steps,
        "tokens_seen": tokens,
        "train_seconds": round(elapsed, 1),
        "tokens_per_s": round(tokens / elapsed),
        "final_train_loss": round(rows[-1]["loss"], 5),
    }
