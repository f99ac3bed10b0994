"""Task vectors and model merges as small functions over tensors, and over state dicts (name ->
tensor) by looping over them; ``stream_merge`` applies one to a model tensor by tensor from the
model folders' safetensors, so host memory holds a few tensors (AR-MAP at 8B).

Task arithmetic: W = W_base + gamma * tau. TIES (Yadav et al. 2023): trim each task vector to its
largest-magnitude entries (``density``), elect a sign per entry by the sign of the summed trimmed
vectors, and average only the entries that agree with it (disjoint mean). DARE (Yu et al. 2024):
drop each entry with probability ``p`` and rescale the survivors by 1 / (1 - p), so the expectation
is the input. Every merge keeps the base's dtype; arithmetic runs in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

StateDict = dict[str, torch.Tensor]


def _float_keys(sd: StateDict) -> list[str]:
    return [k for k, v in sd.items() if torch.is_floating_point(v)]


def task_vector(finetuned: StateDict, base: StateDict) -> StateDict:
    """``finetuned - base`` for every floating-point tensor both share (same shapes required)."""
    missing = set(_float_keys(base)) ^ set(_float_keys(finetuned))
    if missing:
        raise ValueError(f"the two models differ in parameters: {sorted(missing)[:5]}")
    out = {}
    for k in _float_keys(base):
        if finetuned[k].shape != base[k].shape:
            raise ValueError(f"{k}: shape {tuple(finetuned[k].shape)} vs {tuple(base[k].shape)}")
        out[k] = finetuned[k].float() - base[k].float()
    return out


def add_scaled(base: StateDict, tau: StateDict, gamma: float) -> StateDict:
    """Task arithmetic ``base + gamma * tau``; gamma 0 returns the base tensors themselves."""
    if gamma == 0:
        return dict(base)
    out = dict(base)
    for k, t in tau.items():
        out[k] = (base[k].float() + gamma * t).to(base[k].dtype)
    return out


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


def trim(tau: StateDict, density: float) -> StateDict:
    return {k: trim_tensor(t, density) for k, t in tau.items()}


def ties(taus: list[StateDict], density: float) -> StateDict:
    """TIES merge of task vectors: trim, elect sign, disjoint mean."""
    return {k: ties_tensor([t[k] for t in taus], density) for k in taus[0]}


def dare(tau: StateDict, p: float, seed: int = 0) -> StateDict:
    """Drop each entry with probability ``p`` (seeded), rescale the rest by 1 / (1 - p)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: dare_tensor(t, p, gen) for k, t in tau.items()}


@dataclass(frozen=True)
class Merge:
    vector: Callable[[torch.Tensor, dict, torch.Generator], torch.Tensor]  # (tau tensor, options, generator) -> transferred
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


def merged_vector(tau: StateDict, merge: str, options: dict, seed: int = 0) -> StateDict:
    """The preference vector a merge transfers: as is (task arithmetic), TIES-trimmed or DARE-dropped
    (DARE's draws follow the tensors' order, as ``stream_merge`` reads them)."""
    m, gen = _merge(merge), torch.Generator().manual_seed(seed)
    return {k: m.vector(t, options, gen) for k, t in tau.items()}


@torch.no_grad()
def stream_merge(model, base, tuned, pre, gamma: float, merge: str, options: dict, seed: int = 0) -> None:
    """Set ``model``'s weights to ``base + gamma * merged(tuned - pre)``, one tensor at a time, where
    ``base``, ``tuned`` and ``pre`` are :class:`~ar2dlm.core.models.FolderWeights` (AR-MAP: the DLM,
    the DPO'd teacher, the teacher). The arithmetic runs in float32 on the model's device; the
    same seed gives the same DARE draws at every gamma."""
    m, gen = _merge(merge), torch.Generator().manual_seed(seed)
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
