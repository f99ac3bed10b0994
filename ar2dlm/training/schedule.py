"""Learning-rate schedule and mixed-precision context of the training loop (``loop``: conversion
runs and the AR teacher's pretraining). The config checks read ``warmup_misfit``: torch is imported
where a step needs it, not when a config is read."""

from __future__ import annotations

import contextlib
import math


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def autocast(dtype: str, device_type: str):
    """bf16 autocast on ``device_type`` ("cpu" or "cuda") for a resolved ``dtype`` (see
    ``core.precision``), no autocast for fp32."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"autocast takes a resolved dtype (fp32 or bf16), not {dtype!r}")
    if dtype == "bf16":
        import torch

        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def warmup_misfit(warmup_steps: int, steps: int) -> str | None:
    """Why a warm-up of ``warmup_steps`` does not fit a run of ``steps`` (None: it does)."""
    if warmup_steps >= steps:
        return (
            f"{warmup_steps} warm-up steps, not fewer than the run's {steps} steps: the learning rate would never "
            "reach its peak"
        )
    return None
