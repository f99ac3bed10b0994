"""Model merges as small functions over tensors; ``stream_merge`` applies one to a model tensor by
tensor from the model folders' safetensors, so host memory holds a few tensors (AR-MAP at 8B).
(``tests/reference_armap.py`` holds the whole-state-dict merges it is checked against.)

Task arithmetic: W = W_base + gamma * tau. TIES (Yadav et al. 2023): trim each task vector to its
largest-magnitude entries (``density``), elect a sign per entry by the sign of the summed trimmed
vectors, and average only the entries that agree with it (disjoint mean). DARE (Yu et al. 2024):
drop each entry with probability ``p`` and rescale the survivors by 1 / (1 - p), so the expectation
is the input. Every merge keeps the base's dtype; arithmetic runs in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def trim_tensor(t: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the ``density`` share of largest-magnitude entries of ``t``, zero the rest."""
    if not 0 < density <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    n_keep = max(1, round(density * t.numel()))
    if n_keep >= t.numel():
        return t.clone()
    threshold = t.abs().flatten().kthvalue(t.numel() - n_keep + 1).values
    keep = t.abs() >= threshold
    # ties at the threshold: keep exactly n_keep entries, the first ones in memory order
    if int(keep.sum()) > n_keep:
        idx = keep.flatten().nonzero().squeeze(1)[n_keep:]
        keep = keep.flatten().clone()
        keep[idx] = False
        keep = keep.view_as(t)
    return torch.where(keep, t, torch.zeros_like(t))


def ties_tensor(ts: list[torch.Tensor], density: float) -> torch.Tensor:
    """TIES of one tensor of several task vectors: trim, elect sign, disjoint mean."""
    stack = torch.stack([trim_tensor(t, density) for t in ts])
    sign = torch.sign(stack.sum(0))
    agree = (torch.sign(stack) == sign) & (stack != 0)
    return (stack * agree).sum(0) / agree.sum(0).clamp(min=1)


def dare_tensor(t: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Drop each entry with probability ``p`` (CPU draws from ``generator``), rescale the rest by 1 / (1 - p)."""
    if not 0 <= p < 1:
        raise ValueError(f"drop probability must lie in [0, 1), got {p}")
    return t * (torch.rand(t.shape, generator=generator) >= p).to(t.device) / (1 - p)


@dataclass(frozen=True)
class Merge:
    vector: Callable[
        [torch.Tensor, dict, torch.Generator], torch.Tensor
    ]  # (tau tensor, options, generator) -> transferred
    options: tuple[str, ...]  # its config keys (armap.merges.<name>)


# The preference vector each merge transfers, tensor by tensor (the schema's armap.merges names; a
# test ties the two). A whole-model TIES of one vector is the per-tensor trim: the sign election
# and disjoint mean of a single vector change nothing.
MERGES = {
    "task_arithmetic": Merge(lambda t, options, gen: t, ()),
    "ties": Merge(lambda t, options, gen: ties_tensor([t], options["density"]), ("density",)),
    "dare": Merge(lambda t, options, gen: dare_tensor(t, options["p"], gen), ("p",)),
}


def _merge(merge: str) -> Merge:
    if merge not in MERGES:
        raise ValueError(f"unknown merge {merge!r} (known: {', '.join(MERGES)})")
    return MERGES[merge]


@dataclass(frozen=True)
class MergeSettings:
    """One merge as configured: its method (a key of MERGES), its options, and the seed of its
    random drops (DARE)."""

    method: str
    options: dict = field(default_factory=dict)
    seed: int = 0


@torch.no_grad()
def stream_merge(model, weights: tuple, gamma: float, merge: MergeSettings) -> None:
    """Set ``model``'s weights to ``base + gamma * merged(tuned - pre)``, one tensor at a time, where
    ``weights`` = (``base``, ``tuned``, ``pre``) are :class:`~ar2dlm.core.models.FolderWeights`
    (AR-MAP: the DLM, the DPO'd teacher, the teacher). The arithmetic runs in float32 on the model's
    device; the same seed gives the same DARE draws at every gamma."""
    base, tuned, pre = weights
    m, options, gen = _merge(merge.method), merge.options, torch.Generator().manual_seed(merge.seed)
    params = model.state_dict()  # the live tensors (a tied head shares the embedding's)
    for name in base.names():
        b = base[name]
        if not torch.is_floating_point(b):
            continue
        target = params[name]
        if gamma == 0:
            target.copy_(b)
            continue
        dev = target.device
        tau = tuned[name].to(dev, torch.float32) - pre[name].to(dev, torch.float32)
        target.copy_(b.to(dev, torch.float32) + gamma * m.vector(tau, options, gen))
