"""The decode benchmark: tokens/s of real responses (held-out code prompts decoded to end-of-text),
AR against DLM, each decoder beside the pass@1 of its responses.

Decoders (rows): ``hf_generate`` (the AR model through transformers' ``generate``),
``engine_ar`` (the same model through the decode engine), and per confidence threshold
``dynamic_dlm`` (the DLM over a ``DynamicCache``, the path the engine replaced) and ``engine_dlm``.
Every decoder decodes batch after batch interleaved (batch 1: prompt by prompt), ``repeats`` times
each, and a batch's time is the median of its repeats, so load drift falls on every row alike.
Compiles happen in a warm-up over every prompt width bucket first: their time is reported, never
counted. Response tokens stop at end-of-text; tokens per forward divide them by the forwards of
the rows still decoding. Milliseconds per forward kind come from one more pass with each forward
timed (synchronised on a GPU), so that timing never slows the throughput passes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..core.conventions import Conventions
from ..core.engine import WIDTH_BUCKET, DecodeEngine, EngineStats
from ..core.sampling import Decoding, generate_ar, generate_dlm


@dataclass
class Decoder:
    name: str
    threshold: float | None
    decode: Callable[[list[list[int]]], tuple[list[list[int]], dict]]  # a batch -> responses, stats
    engine: DecodeEngine | None = None
    seconds: list[float] = field(default_factory=list)  # per batch: the median of its repeats
    responses: list[list[int]] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)  # per batch

    @property
    def label(self) -> str:
        return self.name if self.threshold is None else f"{self.name}@{self.threshold}"


class SpeedModels(NamedTuple):
    """What the benchmark decodes with: the block DLM, the AR model it is timed against (the DLM's
    own weights decoded causally when no AR model is given), their tokenizer and the DLM's
    conventions."""

    dlm: torch.nn.Module
    ar: torch.nn.Module
    tokenizer: object
    conv: Conventions


def decoders(
    models: SpeedModels, thresholds: list[float], max_new_tokens: int, *, batch_size: int, compile: bool
) -> list[Decoder]:
    """The benchmark's rows: AR through transformers and the engine, the DLM through the
    ``DynamicCache`` path and the engine at each threshold."""
    dlm, ar_model, tokenizer, conv = models
    ar_conv = Conventions("causal", True, conv.mask_token_id, conv.eos_token_id, conv.pad_token_id)
    ar_engine = DecodeEngine(ar_model, ar_conv, compile=compile)
    dlm_engine = DecodeEngine(dlm, conv, compile=compile)

    def hf(batch):
        out = generate_ar(ar_model, tokenizer, batch, Decoding(max_new_tokens), batch_size=len(batch))
        return out, {"response_tokens": sum(map(len, out))}

    def on_engine(engine, **kw):
        def run(batch):
            out, st = engine.generate(batch, Decoding(max_new_tokens, **kw), batch_size=batch_size)
            return out, st.as_dict()

        return run

    def dynamic(t):
        def run(batch):
            out, st = generate_dlm(dlm, conv, batch, Decoding(max_new_tokens, conv.block_size, threshold=t))
            return out, st.as_dict()

        return run

    rows = [Decoder("hf_generate", None, hf), Decoder("engine_ar", None, on_engine(ar_engine), ar_engine)]
    for t in thresholds:
        rows.append(Decoder("dynamic_dlm", t, dynamic(t)))
        rows.append(Decoder("engine_dlm", t, on_engine(dlm_engine, threshold=t), dlm_engine))
    return rows


def batches(prompts: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    return [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(rows: list[Decoder], prompts: list[list[int]], device) -> dict:
    """One decode of a prompt of every width bucket by every decoder (the engines' compiles), timed."""
    by_bucket = {}
    for p in prompts:
        by_bucket.setdefault(-(-len(p) // WIDTH_BUCKET), p)
    seconds = {}
    for row in rows:
        t0 = time.perf_counter()
        for p in by_bucket.values():
            row.decode([p])
        _sync(device)
        seconds[row.label] = round(time.perf_counter() - t0, 2)
    return {"warm_up_seconds": seconds, "width_buckets": len(by_bucket)}


def interleaved(rows: list[Decoder], prompts: list[list[int]], batch_size: int, repeats: int, device) -> None:
    """Every decoder decodes each batch ``repeats`` times before the next batch; each keeps the
    median time, and its responses and statistics (the same every repeat: decoding is greedy)."""
    for batch in batches(prompts, batch_size):
        times: dict[str, list[float]] = {row.label: [] for row in rows}
        for rep in range(repeats):
            for row in rows:
                _sync(device)
                t0 = time.perf_counter()
                out, st = row.decode(batch)
                _sync(device)
                times[row.label].append(time.perf_counter() - t0)
                if rep == 0:
                    row.responses += out
                    row.stats.append(st)
        for row in rows:
            row.seconds.append(statistics.median(times[row.label]))


def kind_times(rows: list[Decoder], prompts: list[list[int]], batch_size: int) -> dict:
    """Milliseconds per forward by step kind for each engine decoder, from one more pass with
    every forward timed."""
    out = {}
    for row in rows:
        if row.engine is None:
            continue
        row.engine.time_kinds = True
        count, ms = {}, {}
        for batch in batches(prompts, batch_size):
            st = row.decode(batch)[1]
            for kind, v in st["ms_per_forward"].items():
                count[kind] = count.get(kind, 0) + st["forwards"][kind]
                ms[kind] = ms.get(kind, 0.0) + v * st["forwards"][kind]
        row.engine.time_kinds = False
        out[row.label] = {k: round(ms[k] / count[k], 3) for k in ms}
    return out


def summary(rows: list[Decoder], pass_at_1: dict[str, float]) -> list[dict]:
    """One record per decoder: response tokens, seconds, tokens/s, response tokens per forward,
    pass@1, the share of responses equal to the replaced path's (the engine against
    ``hf_generate`` and ``dynamic_dlm`` at its threshold), and the ratios to the engine's AR and
    to transformers' ``generate``."""
    by = {row.label: row for row in rows}
    records = []
    for row in rows:
        tokens, seconds = sum(map(len, row.responses)), sum(row.seconds)
        if row.name == "engine_dlm":  # forwards of the rows still decoding
            forwards = sum(s["row_forwards"] for s in row.stats)
        elif row.name == "dynamic_dlm":  # batch forwards; its blocks run whole past end-of-text
            forwards = sum(s["nfe"] for s in row.stats)
        else:
            forwards = tokens
        rec = {
            "decoder": row.name,
            "threshold": row.threshold,
            "batch": row.stats[0].get("batch_size", 1),
            "response_tokens": tokens,
            "seconds": round(seconds, 4),
            "tokens_per_s": round(tokens / max(1e-9, seconds), 1),
            "tokens_per_forward": round(tokens / max(1, forwards), 3),
            "pass@1": pass_at_1[row.label],
        }
        replaced = {"engine_ar": "hf_generate", "engine_dlm": f"dynamic_dlm@{row.threshold}"}.get(row.name)
        if replaced in by:
            same = sum(a == b for a, b in zip(row.responses, by[replaced].responses))
            rec["same_as_replaced"] = round(same / max(1, len(row.responses)), 3)
        records.append(rec)
    ar = next(r for r in records if r["decoder"] == "engine_ar")["tokens_per_s"]
    hf = next(r for r in records if r["decoder"] == "hf_generate")["tokens_per_s"]
    for rec in records:
        rec["over_engine_ar"] = round(rec["tokens_per_s"] / ar, 3)
        rec["over_hf_generate"] = round(rec["tokens_per_s"] / hf, 3)
    return records


def equal_accuracy_speedup(records: list[dict], tolerance: float = 0.02) -> dict:
    """The engine DLM's speed over the engine's AR at the lowest threshold whose pass@1 is within
    ``tolerance`` of its pass@1 at the highest threshold (1.0: one token per step)."""
    dlm = sorted((r for r in records if r["decoder"] == "engine_dlm"), key=lambda r: r["threshold"])
    top = dlm[-1]
    chosen = next(r for r in dlm if r["pass@1"] >= top["pass@1"] - tolerance)
    return {
        "threshold": chosen["threshold"],
        "pass@1": chosen["pass@1"],
        "reference_threshold": top["threshold"],
        "reference_pass@1": top["pass@1"],
        "tolerance": tolerance,
        "over_engine_ar": chosen["over_engine_ar"],
        "tokens_per_forward": chosen["tokens_per_forward"],
    }


@torch.no_grad()
def cost_curve(model, tokens: list[int], context: int, repeats: int = 10, compile: bool = False) -> dict:
    """Milliseconds of one forward of ``n`` new positions (n in ``tokens``) over a ``context``-token
    static cache, median of ``repeats``: where a block step costs what one token costs, the forward
    is bound by reading the weights, not by the positions it computes."""
    device = next(model.parameters()).device
    conv = Conventions("causal", True, None, 0, 0)
    engine = DecodeEngine(model, conv, compile=compile)
    vocab = model.config.vocab_size
    out = {}
    for n in tokens:
        width = context + n
        cache = engine._cache(1, width)  # allocated before any compiled step (CUDA graphs: an input, not an output)
        ids = torch.randint(0, vocab, (1, width), device=device)
        pos = torch.arange(width, device=device)[None]
        mask = torch.zeros(1, 1, width, width, dtype=engine.dtype, device=device)
        mask.masked_fill_(
            torch.ones(width, width, dtype=torch.bool, device=device).triu(1), torch.finfo(engine.dtype).min
        )
        engine._run("prefill", EngineStats(), ids[:, :context], pos[:, :context], mask[:, :, :context], cache, 1)
        keep = torch.arange(n, device=device)
        times = []
        for _ in range(repeats + 1):  # the first run compiles
            engine._rewind(cache, context)
            _sync(device)
            t0 = time.perf_counter()
            engine._run(
                f"cost_{n}", EngineStats(), ids[:, context:], pos[:, context:], mask[:, :, context:], cache, keep
            )
            _sync(device)
            times.append(time.perf_counter() - t0)
        out[str(n)] = round(1e3 * statistics.median(times[1:]), 3)
    return {"context": context, "ms_per_forward": out, "compiled": compile}
