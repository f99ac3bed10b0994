"""Teacher checks: held-out loss on the suites' eval splits and greedy pass@1 on the held-out
code suite, judged by evalplus's oracle."""

from __future__ import annotations

from ..core.likelihood import ar_loglikelihood
from ..core.models import load_model
from ..data.tokenization import encode_pair
from ..provenance import code_commit, library_versions, read_jsonl, settings_hash
from .code import evaluate_code
from .sandbox import require_sandbox


def completion_loss(model, tokenizer, items: list[tuple[str, str]], batch_size: int = 32) -> float:
    """Mean next-token cross-entropy over completion tokens (end-of-text included; the prompt is
    context only)."""
    pairs = [encode_pair(tokenizer, p, c) for p, c in items]
    logps = ar_loglikelihood(model, pairs, tokenizer.pad_token_id, batch_size)
    return -sum(logps) / sum(len(c) for _, c in pairs)


def evaluate_teacher(model_dir, code_eval_path, math_eval_path, cfg: dict) -> dict:
    require_sandbox()  # before the model loads
    model, tok, conv, info = load_model(model_dir)
    if conv.is_diffusion:
        raise ValueError(f"{model_dir} is a {conv.attention}-attention model; the teacher check decodes causally")
    tasks = read_jsonl(code_eval_path)
    if cfg["limit"] is not None:
        tasks = tasks[: cfg["limit"]]
    maths = read_jsonl(math_eval_path)
    heldout = {
        "code": completion_loss(model, tok, [(t["prompt"], t["canonical_solution"]) for t in tasks], cfg["batch_size"]),
        "math": completion_loss(model, tok, [(m["prompt"], m["completion"]) for m in maths], cfg["batch_size"]),
    }
    code_cfg = {
        "n_samples": 1,
        "temperature": 0.0,
        "max_new_tokens": cfg["max_new_tokens"],
        "batch_size": cfg["batch_size"],
        "format": "evalplus",
        "dataset": "humaneval",
        "style": "body",
        "parallel": cfg["parallel"],
    }
    code = evaluate_code(model, tok, conv, tasks, code_cfg)
    return {
        "benchmark": "synthetic_code",
        "run": "teacher",
        "decoding": "greedy AR with KV cache",
        "n_tasks": len(tasks),
        "samples_per_task": 1,
        **code["metrics"],
        "heldout_loss": heldout,
        "generated_tokens": code["decoding"]["response_tokens"],
        "generation_seconds": code["decoding"]["seconds"],
        "settings": cfg,
        "conventions": conv.to_dict(),
        "code_eval": str(code_eval_path),
        "versions": library_versions(),
        "provenance": {
            "commit": code_commit(),
            "model_settings_sha256": settings_hash(info),
            "benchmark_settings_sha256": settings_hash(cfg),
        },
        "samples": code["samples"],
    }
