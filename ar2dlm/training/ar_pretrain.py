"""Causal-LM pretraining of the tiny teacher on a packed token stream (nanoGPT-style loop)."""

from __future__ import annotations

import csv
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.tokenization import encode_pair
from .schedule import autocast, lr_at


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


def pretrain(model, train_rows: torch.Tensor, *, steps: int, batch_size: int, lr: float,
             warmup_steps: int, weight_decay: float, grad_clip: float, dtype: str, seed: int,
             log_path: str | Path, log_every: int = 10) -> dict:
    """Train ``model`` in place; log step, loss, lr, tokens/s to a CSV; return a summary."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    model.train()
    order = torch.randperm(len(train_rows), generator=gen)
    cursor, tokens_seen, t0 = 0, 0, time.time()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "loss", "lr", "tokens_per_s", "elapsed_s"])
        bar = tqdm(range(steps), desc="pretrain", mininterval=5)
        for step in bar:
            if cursor + batch_size > len(order):
                order, cursor = torch.randperm(len(train_rows), generator=gen), 0
            batch = train_rows[order[cursor:cursor + batch_size]]
            cursor += batch_size
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, lr, warmup_steps)
            with autocast(dtype, "cpu"):
                logits = model(input_ids=batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {loss.item()} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            tokens_seen += batch[:, :-1].numel()
            if step % log_every == 0 or step == steps - 1:
                elapsed = time.time() - t0
                writer.writerow([step, f"{loss.item():.5f}", f"{opt.param_groups[0]['lr']:.3e}",
                                 f"{tokens_seen / elapsed:.0f}", f"{elapsed:.1f}"])
                f.flush()
                bar.set_postfix(loss=f"{loss.item():.3f}")
    elapsed = time.time() - t0
    return {
        "steps": steps,
        "tokens_seen": tokens_seen,
        "train_seconds": round(elapsed, 1),
        "tokens_per_s": round(tokens_seen / elapsed),
        "final_train_loss": round(loss.item(), 5),
    }
