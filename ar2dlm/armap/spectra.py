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
MODULE_TYPES = {"q_proj": "attention", "k_proj": "attention", "v_proj": "attention", "o_proj": "attention",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp", "embed_tokens": "embeddings",
                "lm_head": "lm_head"}


def matrix_stats(m: torch.Tensor, top_k: int = 8) -> dict:
    s = torch.linalg.svdvals(m.float())
    energy = s.pow(2)
    total = float(energy.sum())
    if total == 0:
        return {"spectral_norm": 0.0, "frobenius_norm": 0.0, "effective_rank": 0.0, f"top{top_k}_energy": 0.0}
    p = s / s.sum()
    p = p[p > 0]
    return {"spectral_norm": float(s[0]), "frobenius_norm": total ** 0.5,
            "effective_rank": float(torch.exp(-(p * p.log()).sum())),
            f"top{top_k}_energy": float(energy[:top_k].sum() / total)}


def describe(name: str) -> tuple[int | None, str]:
    """(layer index or None, module type) of a parameter name."""
    m = _LAYER.search(name)
    module = next((t for key, t in MODULE_TYPES.items() if key in name), "other")
    return (int(m.group(1)) if m else None), (name.split(".")[-2] if module in ("attention", "mlp") else module)


def _row(name: str, pref: torch.Tensor, diffusion: torch.Tensor, top_k: int) -> dict:
    layer, module = describe(name)
    a, b = matrix_stats(pref, top_k), matrix_stats(diffusion, top_k)
    return {"parameter": name, "layer": layer, "module": module, "module_type": MODULE_TYPES.get(module, module),
            **{f"pref_{k}": v for k, v in a.items()}, **{f"diffusion_{k}": v for k, v in b.items()},
            "shadowing_ratio": b["spectral_norm"] / a["spectral_norm"] if a["spectral_norm"] else float("inf")}


def spectra_table(tau_pref: dict, tau_diffusion: dict, top_k: int = 8) -> pd.DataFrame:
    """One row per 2-D weight matrix with both vectors' statistics and the shadowing ratio."""
    return pd.DataFrame([_row(name, t, tau_diffusion[name], top_k) for name, t in tau_pref.items() if t.dim() == 2])


def streamed_spectra(ar, dpo, dlm, top_k: int = 8, device="cpu") -> pd.DataFrame:
    """:func:`spectra_table` of tau_pref = dpo - ar and tau_diffusion = ar - dlm from three folders'
    weights (``FolderWeights``), one matrix at a time (on ``device``): host memory holds the
    matrices of one parameter, not the models."""
    rows = []
    for name in ar.names():
        if len(ar.shapes[name]) != 2:
            continue
        w = ar[name].to(device, torch.float32)
        rows.append(_row(name, dpo[name].to(device, torch.float32) - w, w - dlm[name].to(device, torch.float32), top_k))
    return pd.DataFrame(rows)


def plot_shadowing(table: pd.DataFrame, title: str, pdf_path, png_path) -> None:
    """Shadowing ratio by layer, one line per module type (log scale; 1 = equal spectral norms)."""
    from ..reporting.figures import pyplot, save

    plt = pyplot()

    layered = table.dropna(subset=["layer"])
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for module, part in layered.groupby("module"):
        part = part.sort_values("layer")
        ax.plot(part["layer"], part["shadowing_ratio"], marker="o", label=module)
    for name, part in table[table["layer"].isna()].groupby("module"):
        ax.axhline(float(part["shadowing_ratio"].iloc[0]), ls=":", lw=1, color="grey")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("||tau_diffusion||_2 / ||tau_pref||_2")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    save(fig, pdf_path, png_path)
