"""Teacher checks: held-out loss on the suites' eval splits and greedy pass@1 on the held-out
code suite, scored by evalplus."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..conventions import Conventions
from ..likelihood import ar_loglikelihood
from ..models import load_model
from ..provenance import library_versions, read_jsonl, write_jsonl
from ..sampling import generate_ar
from ..tokenization import encode_pair
from .code import score_with_evalplus, truncate_completion


def completion_loss(model, tokenizer, items: list[tuple[str, str]], batch_size: int = 32) -> float:
    """Mean next-token cross-entropy over completion tokens (end-of-text included; the prompt is
    context only)."""
    pairs = [encode_pair(tokenizer, p, c) for p, c in items]
    logps = ar_loglikelihood(model, pairs, tokenizer.pad_token_id, batch_size)
    return -sum(logps) / sum(len(c) for _, c in pairs)


def evaluate_teacher(model_dir, code_eval_path, math_eval_path, cfg: dict) -> dict:
    model, tok, info = load_model(model_dir)
    conv = Conventions.from_dict(info)
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
    t0 = time.time()
    prompts = [encode_pair(tok, t["prompt"], "", eos=False)[0] for t in tasks]
    outs = generate_ar(model, tok, prompts, cfg["max_new_tokens"], batch_size=cfg["batch_size"])
    gen_s = time.time() - t0
    samples = [{"task_id": t["task_id"], "completion": truncate_completion(tok.decode(o))} for t, o in zip(tasks, outs)]
    # evalplus scores the whole problem file, so score against the (possibly limited) task list itself.
    with tempfile.TemporaryDirectory() as tmp:
        problems = Path(tmp) / "problems.jsonl"
        write_jsonl(problems, tasks)
        scored = score_with_evalplus(problems, samples, parallel=cfg["parallel"])
    return {
        "benchmark": "synthetic_code", "run": "teacher", "decoding": "greedy AR with KV cache",
        "n_tasks": len(tasks), "samples_per_task": 1, **scored["metrics"],
        "heldout_loss": heldout, "generated_tokens": sum(len(o) for o in outs), "generation_seconds": round(gen_s, 2),
        "settings": cfg, "conventions": conv.to_dict(), "code_eval": str(code_eval_path),
        "versions": library_versions(),
        "samples": [{**s, "base": scored["per_task"][s["task_id"]][0]["base"],
                     "plus": scored["per_task"][s["task_id"]][0]["plus"]} for s in samples],
    }
