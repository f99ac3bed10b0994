"""AR-MAP stage glue: what each rule runs, on the folders the other stages wrote."""

from __future__ import annotations

import time

import torch

from ..core.models import load_model, save_model
from ..provenance import library_versions, read_jsonl, write_json
from .gamma import gamma_search
from .merge import task_vector
from .spectra import plot_shadowing, spectra_table


def preference_rows(paths: list[str], limit: int | None = None) -> list[dict]:
    """Pairs of one or several domains (interleaved, so a limit keeps every domain)."""
    per_domain = [read_jsonl(p) for p in paths]
    rows = [r for group in zip(*per_domain) for r in group] if len(per_domain) > 1 else per_domain[0]
    return rows[:limit] if limit else rows


def _state(model_dir) -> dict:
    model = load_model(model_dir, dtype=torch.float32).model
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def spectra(teacher_dir, dpo_dir, dlm_dir, csv_path, pdf_path, png_path, title: str):
    """tau_pref = W_AR_dpo - W_AR and tau_diffusion = W_AR - W_DLM, per matrix; CSV and figure."""
    ar = _state(teacher_dir)
    table = spectra_table(task_vector(_state(dpo_dir), ar), task_vector(ar, _state(dlm_dir)))
    table.to_csv(csv_path, index=False)
    plot_shadowing(table, title, pdf_path, png_path)
    return table


def search(teacher_dir, dpo_dir, dlm_dir, eval_rows: list[dict], cfg: dict, merge: str, out_json, out_model, seed: int):
    """Gamma search for one (DLM, preference vector, merge); the merge at gamma_hat is saved as an
    HF folder carrying the DLM's conventions."""
    t0 = time.time()
    tau = task_vector(_state(dpo_dir), _state(teacher_dir))
    model, tok, conv, info = load_model(dlm_dir, dtype=torch.float32)
    if not conv.is_diffusion:
        raise ValueError(f"{dlm_dir} is causal; AR-MAP transfers preferences to a DLM")
    result = gamma_search(model, conv, tok, model.state_dict(), tau, eval_rows, grid=cfg["grid"], merge=merge,
                          options=cfg["merges"][merge], beta=cfg["beta"], n_samples=cfg["elbo_samples"], seed=seed)
    result.update(dlm=str(dlm_dir), preference_model=str(dpo_dir), teacher=str(teacher_dir), seed=seed,
                  wall_seconds=round(time.time() - t0, 1), versions=library_versions())
    save_model(model, tok, out_model, {**info, "method": f"armap_{merge}", "base_model": str(dlm_dir),
                                       "preference_model": str(dpo_dir), "gamma": result["gamma_hat"],
                                       "versions": library_versions()})
    write_json(out_json, result)
    return result
