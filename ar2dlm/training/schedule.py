"""Learning-rate schedule and mixed-precision context shared by the training loops written
here (AR pretraining, conversion)."""

from __future__ import annotations

import contextlib
import math

import torch


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def autocast(dtype: str):
    if dtype == "bf16":
        return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
