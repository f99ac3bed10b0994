"""Whole-state-dict references for AR-MAP's streamed weight work: the tests (and
``benchmarks/armap_memory.py``) check ``stream_merge`` and ``streamed_spectra``, which read one
tensor at a time, against these, which hold every tensor (name -> tensor) in memory."""

from __future__ import annotations

import pandas as pd
import torch

from ar2dlm.armap.merge import MERGES, dare_tensor, ties_tensor, trim_tensor
from ar2dlm.armap.spectra import spectra_row

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
    return {k: trim_tensor(t, density) for k, t in tau.items()}


def ties(taus: list[StateDict], density: float) -> StateDict:
    """TIES merge of task vectors: trim, elect sign, disjoint mean."""
    return {k: ties_tensor([t[k] for t in taus], density) for k in taus[0]}


def dare(tau: StateDict, p: float, seed: int = 0) -> StateDict:
    """Drop each entry with probability ``p`` (seeded), rescale the rest by 1 / (1 - p)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: dare_tensor(t, p, gen) for k, t in tau.items()}


def merged_vector(tau: StateDict, merge: str, options: dict, seed: int = 0) -> StateDict:
    """The preference vector a merge transfers: as is (task arithmetic), TIES-trimmed or DARE-dropped
    (DARE's draws follow the tensors' order, as ``stream_merge`` reads them)."""
    gen = torch.Generator().manual_seed(seed)
    return {k: MERGES[merge].vector(t, options, gen) for k, t in tau.items()}


def spectra_table(tau_pref: StateDict, tau_diffusion: StateDict, top_k: int = 8) -> pd.DataFrame:
    """One row per 2-D weight matrix with both vectors' statistics and the shadowing ratio."""
    return pd.DataFrame(
        [spectra_row(name, t, tau_diffusion[name], top_k) for name, t in tau_pref.items() if t.dim() == 2]
    )
