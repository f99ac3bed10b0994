"""Spectral analysis of task vectors per weight matrix: does the diffusion-conversion update
``tau_diffusion = W_AR - W_DLM`` overshadow the preference update ``tau_pref = W_AR_dpo - W_AR``?

For each 2-D weight matrix: singular values (``torch.linalg.svdvals``), spectral norm, Frobenius
norm, effective rank (exp of the entropy of the normalised singular values, Roy & Vetterli 2007)
and the energy share of the top-k singular values. The shadowing ratio of a matrix is
``spectral_norm(tau_diffusion) / spectral_norm(tau_pref)``: above 1, a preference update of the
same scale would sit under the conversion's dominant directions.
"""

from __future__ import annotations

import re

import pandas as pd
import torch

_LAYER = re.compile(r"\.layers\.(\d+)\.")
MODULE_TYPES = {
    "q_proj": "attention",
    "k_proj": "attention",
    "v_proj": "attention",
    "o_proj": "attention",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
    "embed_tokens": "embeddings",
    "lm_head": "lm_head",
}


def matrix_stats(m: torch.Tensor, top_k: int = 8) -> dict:
    s = torch.linalg.svdvals(m.float())
    energy = s.pow(2)
    total = float(energy.sum())
    if total == 0:
        return {"spectral_norm": 0.0, "frobenius_norm": 0.0, "effective_rank": 0.0, f"top{top_k}_energy": 0.0}
    p = s / s.sum()
    p = p[p > 0]
    return {
        "spectral_norm": float(s[0]),
        "frobenius_norm": total**0.5,
        "effective_rank": float(torch.exp(-(p * p.log()).sum())),
        f"top{top_k}_energy": float(energy[:top_k].sum() / total),
    }


def describe(name: str) -> tuple[int | None, str]:
    """(layer index or None, module type) of a parameter name."""
    m = _LAYER.search(name)
    module = next((t for key, t in MODULE_TYPES.items() if key in name), "other")
    return (int(m.group(1)) if m else None), (name.split(".")[-2] if module in ("attention", "mlp") else module)


def spectra_row(name: str, pref: torch.Tensor, diffusion: torch.Tensor, top_k: int = 8) -> dict:
    """One matrix's row of the spectra table: both task vectors' statistics and the shadowing ratio."""
    layer, module = describe(name)
    a, b = matrix_stats(pref, top_k), matrix_stats(diffusion, top_k)
    return {
        "parameter": name,
        "layer": layer,
        "module": module,
        "module_type": MODULE_TYPES.get(module, module),
        **{f"pref_{k}": v for k, v in a.items()},
        **{f"diffusion_{k}": v for k, v in b.items()},
        "shadowing_ratio": b["spectral_norm"] / a["spectral_norm"] if a["spectral_norm"] else float("inf"),
    }


def streamed_spectra(ar, dpo, dlm, top_k: int = 8, device="cpu") -> pd.DataFrame:
    """One :func:`spectra_row` per 2-D weight matrix of tau_pref = dpo - ar and tau_diffusion =
    ar - dlm from three folders' weights (``FolderWeights``), one matrix at a time (on ``device``):
    host memory holds the matrices of one parameter, not the models."""
    rows = []
    for name in ar.names():
        if len(ar.shapes[name]) != 2:
            continue
        w = ar[name].to(device, torch.float32)
        pref, diffusion = dpo[name].to(device, torch.float32) - w, w - dlm[name].to(device, torch.float32)
        rows.append(spectra_row(name, pref, diffusion, top_k))
    return pd.DataFrame(rows)
