"""AR-MAP stage glue: what each rule runs, on the folders the other stages wrote."""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import torch

from ..core.models import FolderWeights, load_model, resolve_device, save_model
from ..provenance import library_versions, read_jsonl, write_json
from .gamma import GammaSearch, gamma_search
from .spectra import streamed_spectra


def preference_rows(paths: list[str], limit: int | None = None) -> list[dict]:
    """Pairs of one or several domains (interleaved, so a limit keeps every domain)."""
    per_domain = [read_jsonl(p) for p in paths]
    rows = [r for group in zip(*per_domain) for r in group] if len(per_domain) > 1 else per_domain[0]
    return rows[:limit] if limit else rows


class ArmapFolders(NamedTuple):
    """The three model folders an AR-MAP job reads: the AR teacher, its DPO'd copy, the DLM."""

    teacher: str | Path
    preference: str | Path
    dlm: str | Path

    def weights(self) -> tuple[FolderWeights, FolderWeights, FolderWeights]:
        """The teacher's, the DPO'd teacher's and the DLM's weights, read tensor by tensor; checked
        to match before any work."""
        ar, dpo, dlm = (FolderWeights(d) for d in self)
        ar.check_matches(dpo)
        ar.check_matches(dlm)
        return ar, dpo, dlm


def spectra(folders: ArmapFolders, csv_path):
    """tau_pref = W_AR_dpo - W_AR and tau_diffusion = W_AR - W_DLM, per matrix, written as CSV."""
    table = streamed_spectra(*folders.weights(), device=resolve_device("auto"))
    table.to_csv(csv_path, index=False)
    return table


def search(folders: ArmapFolders, eval_rows: list[dict], settings: GammaSearch, out_json, out_model):
    """Gamma search for one (DLM, preference vector, merge); the merge at gamma_hat is saved as an
    HF folder carrying the DLM's conventions."""
    t0 = time.time()
    ar, dpo, dlm = folders.weights()
    model, tok, conv, info = load_model(folders.dlm, dtype=torch.float32)
    if not conv.is_diffusion:
        raise ValueError(f"{folders.dlm} is causal; AR-MAP transfers preferences to a DLM")
    result = gamma_search(model, conv, tok, (dlm, dpo, ar), eval_rows, settings)
    result.update(
        dlm=str(folders.dlm),
        preference_model=str(folders.preference),
        teacher=str(folders.teacher),
        seed=settings.seed,
        wall_seconds=round(time.time() - t0, 1),
        versions=library_versions("fp32"),
    )
    save_model(
        model,
        tok,
        out_model,
        {
            **info,
            "method": f"armap_{settings.merge}",
            "base_model": str(folders.dlm),
            "preference_model": str(folders.preference),
            "gamma": result["gamma_hat"],
            "versions": library_versions(),
        },
    )
    write_json(out_json, result)
    return result
