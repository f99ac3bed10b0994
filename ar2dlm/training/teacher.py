"""The AR teacher stage: pretrain a small Qwen3 here, or fetch a pretrained checkpoint."""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import torch

from ..core.models import build_qwen3, resolve_pretrained, save_model
from ..core.precision import resolve_dtype
from ..data.tokenization import load_pretrained_tokenizer
from ..provenance import library_versions, read_jsonl


def ar_conventions(tokenizer) -> dict:
    """Decoding conventions of a causal LM: every model folder carries them (see models.py)."""
    return {
        "attention": "causal",
        "shift": True,
        "block_size": None,
        "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


class TeacherJob(NamedTuple):
    """A teacher to make: its ``models.<name>`` section, the seed and the preset it is made for."""

    model_cfg: dict
    seed: int
    preset: str


def pretrain_teacher(job: TeacherJob, tokenizer_dir, corpus_path, out_dir, loss_log) -> dict:
    """Pretrain the section's Qwen3 on the corpus here (on the CPU), its loss logged to ``loss_log``."""
    from transformers import AutoTokenizer

    from .ar_pretrain import pack_documents, pretrain

    model_cfg, seed, preset = job
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    arch, pre = dict(model_cfg["arch"], init_seed=seed), model_cfg["pretrain"]
    model = build_qwen3(arch, tok)
    rows = pack_documents(read_jsonl(corpus_path), tok, pre["seq_len"], seed)
    dtype = resolve_dtype(pre["dtype"], "cpu")  # pretraining runs on the CPU
    summary = pretrain(model, rows, pre, dtype=dtype, seed=seed, log_path=loss_log)
    info = {
        **ar_conventions(tok),
        "method": "ar_pretrain",
        "preset": preset,
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "arch": model_cfg["arch"],
        "pretrain": pre,
        "data": {"corpus": str(corpus_path), "corpus_tokens": int(rows.numel()), **summary},
        "versions": library_versions(dtype),
    }
    save_model(model, tok, out_dir, info)
    return info


def fetch_teacher(job: TeacherJob, out_dir) -> dict:
    """Resolve the checkpoint (fails at once offline, naming model_path) and write it as a project
    folder: weights, tokenizer with the mask token, conventions JSON."""
    from transformers import AutoModelForCausalLM

    model_cfg, seed, preset = job

    t0 = time.time()
    local = resolve_pretrained(model_cfg["hub_id"], model_cfg["model_path"], model_cfg["revision"])
    tok = load_pretrained_tokenizer(local)
    model = AutoModelForCausalLM.from_pretrained(local, dtype="auto")
    info = {
        **ar_conventions(tok),
        "method": "pretrained",
        "preset": preset,
        "seed": seed,
        "hub_id": model_cfg["hub_id"],
        "model_path": model_cfg["model_path"],
        "revision": model_cfg["revision"],
        "source_folder": str(Path(local)),
        "parameters": sum(p.numel() for p in model.parameters()),
        "fetch_seconds": round(time.time() - t0, 1),
        "versions": library_versions(),
    }
    save_model(model, tok, out_dir, info)
    return info
