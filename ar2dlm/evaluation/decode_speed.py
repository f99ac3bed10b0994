"""Decoding throughput: AR with KV cache vs DLM block decoding with and without the exact prefix
KV cache, on one model, one machine, one run. Every figure states its batch size."""

from __future__ import annotations

import time

import torch

from ..core.conventions import Conventions
from ..core.sampling import generate_ar, generate_dlm


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def decode_benchmark(
    model,
    ar_model,
    tokenizer,
    conv: Conventions,
    prompts: list[list[int]],
    *,
    block_size: int,
    lengths: list[int],
    thresholds: list[float],
    ratio_length: int,
    cache_lengths: list[int],
    reference_threshold: float,
) -> dict:
    """All figures for ``prompts`` decoded as one batch. Decoding runs to the full length (no
    end-of-text stop), so every variant produces the same number of tokens. ``ar_model`` (the
    teacher, same architecture) is the AR baseline."""
    n = len(prompts)
    generate_dlm(model, conv, prompts, block_size, block_size, threshold=0.9, stop_at_eos=False)  # warm-up
    generate_ar(ar_model, tokenizer, prompts, 8, batch_size=n, stop_at_eos=False)

    def ar(length):
        _, s = _timed(lambda: generate_ar(ar_model, tokenizer, prompts, length, batch_size=n, stop_at_eos=False))
        return {"length": length, "seconds": round(s, 4), "tokens_per_s": round(n * length / s, 1)}

    def dlm(length, threshold, cache):
        (_, st), _ = _timed(
            lambda: generate_dlm(
                model, conv, prompts, length, block_size, threshold=threshold, use_cache=cache, stop_at_eos=False
            )
        )
        return {"length": length, "threshold": threshold, "cache": cache, **st.as_dict()}

    ar_runs = [ar(L) for L in lengths]
    ar_ref = next(r for r in ar_runs if r["length"] == ratio_length)
    thresh_runs = [dlm(ratio_length, t, True) for t in thresholds]
    cache_runs = [dlm(L, reference_threshold, c) for L in cache_lengths for c in (True, False)]
    length_runs = [dlm(L, reference_threshold, True) for L in lengths]

    def at(L, cache):
        return next(r for r in cache_runs if r["length"] == L and r["cache"] == cache)

    return {
        "batch_size": n,
        "block_size": block_size,
        "device": str(next(model.parameters()).device),
        "threads": torch.get_num_threads(),
        "ar": ar_runs,
        "dlm_thresholds": thresh_runs,
        "dlm_cache_vs_uncached": cache_runs,
        "dlm_cached_lengths": length_runs,
        "ratios": {
            "dlm_cached_over_ar_tokens_per_s": {
                str(r["threshold"]): round(r["tokens_per_s"] / ar_ref["tokens_per_s"], 3) for r in thresh_runs
            },
            "cached_over_uncached_speed": {
                str(L): round(at(L, False)["seconds"] / at(L, True)["seconds"], 3) for L in cache_lengths
            },
        },
        "time_growth": {  # seconds per token at each length: flat = linear time in length
            "ar": {str(r["length"]): round(r["seconds"] / r["length"], 6) for r in ar_runs},
            "dlm_cached": {str(r["length"]): round(r["seconds"] / r["length"], 6) for r in length_runs},
            "dlm_uncached": {str(L): round(at(L, False)["seconds"] / L, 6) for L in cache_lengths},
        },
    }


def task_benchmark(
    model,
    ar_model,
    tokenizer,
    conv: Conventions,
    prompts: list[list[int]],
    *,
    block_size: int,
    max_new_tokens: int,
    thresholds: list[float],
    batch_size: int = 1,
) -> dict:
    """Real responses: every prompt decoded until end-of-text, AR and DLM (cached) at each
    threshold; tokens/s counts response tokens only. This is where tokens per step is meaningful."""

    def over_prompts(fn):
        tokens, seconds, extra = 0, 0.0, []
        for i in range(0, len(prompts), batch_size):
            (out, stats), s = _timed(lambda i=i: fn(prompts[i : i + batch_size]))
            tokens += sum(len(o) for o in out)
            seconds += s
            extra.append(stats)
        return tokens, seconds, extra

    ar_tokens, ar_s, _ = over_prompts(
        lambda b: (generate_ar(ar_model, tokenizer, b, max_new_tokens, batch_size=len(b)), None)
    )
    rows = []
    for t in thresholds:
        toks, secs, stats = over_prompts(
            lambda b, t=t: generate_dlm(model, conv, b, max_new_tokens, block_size, threshold=t)
        )
        rows.append(
            {
                "threshold": t,
                "response_tokens": toks,
                "seconds": round(secs, 4),
                "tokens_per_s": round(toks / secs, 1),
                "tokens_per_step": round(sum(x.decoded for x in stats) / max(1, sum(x.steps for x in stats)), 4),
                "over_ar": round((toks / secs) / (ar_tokens / ar_s), 3),
            }
        )
    return {
        "prompts": len(prompts),
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "ar": {"response_tokens": ar_tokens, "seconds": round(ar_s, 4), "tokens_per_s": round(ar_tokens / ar_s, 1)},
        "dlm": rows,
    }


def format_report(result: dict) -> str:
    r = result["ratios"]
    lines = [
        f"decode benchmark (batch {result['batch_size']}, block {result['block_size']}, {result['device']}, "
        f"{result['threads']} threads)"
    ]
    lines += [
        f"  DLM cached / AR tokens/s at threshold {t}: {v}x  (tokens/step "
        f"{next(x['tokens_per_step'] for x in result['dlm_thresholds'] if str(x['threshold']) == t)})"
        for t, v in r["dlm_cached_over_ar_tokens_per_s"].items()
    ]
    lines += [f"  cached / uncached speed at {L} new tokens: {v}x" for L, v in r["cached_over_uncached_speed"].items()]
    for name, growth in result["time_growth"].items():
        lines.append(f"  {name} seconds per token by length: {growth}")
    task = result.get("tasks")
    if task:
        lines.append(
            f"  real responses ({task['prompts']} prompts to end-of-text, batch {task['batch_size']}): "
            f"AR {task['ar']['tokens_per_s']} tok/s"
        )
        lines += [
            f"    threshold {r['threshold']}: DLM cached {r['tokens_per_s']} tok/s = {r['over_ar']}x AR, "
            f"{r['tokens_per_step']} tokens/step"
            for r in task["dlm"]
        ]
    return "\n".join(lines)
