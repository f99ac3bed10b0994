"""AR-MAP stage glue: what each rule runs, on the folders the other stages wrote."""

from __future__ import annotations

import time

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


def _weights(teacher_dir, dpo_dir, dlm_dir) -> tuple:
    """The three folders' weights, read tensor by tensor; checked to match before any work."""
    ar, dpo, dlm = (FolderWeights(d) for d in (teacher_dir, dpo_dir, dlm_dir))
    ar.check_matches(dpo)
    ar.check_matches(dlm)
    return ar, dpo, dlm


def spectra(teacher_dir, dpo_dir, dlm_dir, csv_path):
    """tau_pref = W_AR_dpo - W_AR and tau_diffusion = W_AR - W_DLM, per matrix, written as CSV."""
    table = streamed_spectra(*_weights(teacher_dir, dpo_dir, dlm_dir), device=resolve_device("auto"))
    table.to_csv(csv_path, index=False)
    return table


def search(teacher_dir, dpo_dir, dlm_dir, eval_rows: list[dict], cfg: dict, merge: str, out_json, out_model, seed: int):
    """Gamma search for one (DLM, preference vector, merge); the merge at gamma_hat is saved as an
    HF folder carrying the DLM's conventions."""
    t0 = time.time()
    ar, dpo, dlm = _weights(teacher_dir, dpo_dir, dlm_dir)
    model, tok, conv, info = load_model(dlm_dir, dtype=torch.float32)
    if not conv.is_diffusion:
        raise ValueError(f"{dlm_dir} is causal; AR-MAP transfers preferences to a DLM")
    result = gamma_search(model, conv, tok, (dlm, dpo, ar), eval_rows, GammaSearch.from_config(cfg, merge, seed))
    result.update(
        dlm=str(dlm_dir),
        preference_model=str(dpo_dir),
        teacher=str(teacher_dir),
        seed=seed,
        wall_seconds=round(time.time() - t0, 1),
        versions=library_versions("fp32"),
    )
    save_model(
        model,
        tok,
        out_model,
        {
            **info,
            "method": f"armap_{merge}",
            "base_model": str(dlm_dir),
            "preference_model": str(dpo_dir),
            "gamma": result["gamma_hat"],
            "versions": library_versions(),
        },
    )
    write_json(out_json, result)
    return result
