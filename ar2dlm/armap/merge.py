"""Task vectors and model merges as small functions over state dicts (name -> tensor).

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


def trim(tau: StateDict, density: float) -> StateDict:
    """Keep the ``density`` share of largest-magnitude entries of each tensor, zero the rest."""
    if not 0 < density <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    out = {}
    for k, t in tau.items():
        n_keep = max(1, round(density * t.numel()))
        if n_keep >= t.numel():
            out[k] = t.clone()
            continue
        threshold = t.abs().flatten().kthvalue(t.numel() - n_keep + 1).values
        keep = t.abs() >= threshold
        # ties at the threshold: keep exactly n_keep entries, the first ones in memory order
        if int(keep.sum()) > n_keep:
            idx = keep.flatten().nonzero().squeeze(1)[n_keep:]
            keep = keep.flatten().clone()
            keep[idx] = False
            keep = keep.view_as(t)
        out[k] = torch.where(keep, t, torch.zeros_like(t))
    return out


def ties(taus: list[StateDict], density: float) -> StateDict:
    """TIES merge of task vectors: trim, elect sign, disjoint mean."""
    trimmed = [trim(t, density) for t in taus]
    out = {}
    for k in trimmed[0]:
        stack = torch.stack([t[k] for t in trimmed])
        sign = torch.sign(stack.sum(0))
        agree = (torch.sign(stack) == sign) & (stack != 0)
        total = (stack * agree).sum(0)
        count = agree.sum(0).clamp(min=1)
        out[k] = total / count
    return out


def dare(tau: StateDict, p: float, seed: int = 0) -> StateDict:
    """Drop each entry with probability ``p`` (seeded), rescale the rest by 1 / (1 - p)."""
    if not 0 <= p < 1:
        raise ValueError(f"drop probability must lie in [0, 1), got {p}")
    gen = torch.Generator().manual_seed(seed)
    return {k: t * (torch.rand(t.shape, generator=gen) >= p) / (1 - p) for k, t in tau.items()}


@dataclass(frozen=True)
class Merge:
    vector: Callable[[StateDict, dict, int], StateDict]  # (tau, options, seed) -> the vector transferred
    options: tuple[str, ...]  # its config keys (armap.merges.<name>)


# The preference vector each merge transfers (the schema's armap.merges names; a test ties the two).
MERGES = {
    "task_arithmetic": Merge(lambda tau, options, seed: tau, ()),
    "ties": Merge(lambda tau, options, seed: ties([tau], options["density"]), ("density",)),
    "dare": Merge(lambda tau, options, seed: dare(tau, options["p"], seed), ("p",)),
}


def merged_vector(tau: StateDict, merge: str, options: dict, seed: int = 0) -> StateDict:
    """The preference vector a merge transfers: as is (task arithmetic), TIES-trimmed or DARE-dropped."""
    if merge not in MERGES:
        raise ValueError(f"unknown merge {merge!r} (known: {', '.join(MERGES)})")
    return MERGES[merge].vector(tau, options, seed)
