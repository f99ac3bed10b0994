"""The decode engine: AR and DLM decoding over a preallocated static KV cache with fixed shapes per
step kind, compiled once per kind, tokens chosen on the device.

The model is the transformers Qwen3 module itself (its 4D mask is used as given) over a
transformers ``StaticCache``: keys and values are written in place at the cache's write position,
and every forward attends over the cache's whole width through the canvas mask, so each step kind
has one shape:

- ``prefill``: the prompts (left-padded to a width bucket), logits at the last position only;
- ``ar``: one token per row;
- ``block``: one block (a DLM step inside a block);
- ``block_first``: the previous block's final tokens and the new block in one forward (a finished
  block's exact keys and values join the cache with the next block's first step);
- ``canvas``: the whole canvas (bidirectional models, or block models decoded without a cache),
  logits at the decoding block only.

Why by hand: transformers' ``generate`` runs AR only and its generic loop (logits processors,
stopping criteria, a host sync per token) costs more than a small model's forward; no library
decodes block-diffusion models over a static cache. The loop here holds what the methods need:
confidence-threshold or fixed-steps unmasking, the shift convention's carried logit, and a stop
at end-of-text inside a block once every earlier position is filled. One host read per step (the
stop flags) is the only synchronisation; everything else stays on the device.

Batches keep their shape: a finished row is frozen (it picks nothing more) rather than removed,
and a short batch is padded with copies of its last prompt, so a compiled step never recompiles
for a batch size. Prompt widths are bucketed (``WIDTH_BUCKET``) so that a suite's prompts share a
few cache widths.
"""

from __future__ import annotations

import itertools
import time
import types
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
from tqdm import tqdm
from transformers import StaticCache

from .attention import attention_mask, position_ids
from .conventions import Conventions
from .sampling import CACHE_KW, DecodeStats, Decoding, _pick, check_decode_args, left_pad, sample_categorical

WIDTH_BUCKET = 64  # prompts are left-padded to a multiple of this: a suite shares a few compiled widths
STEP_KINDS = ("prefill", "ar", "block_first", "block", "canvas")


@dataclass
class EngineStats(DecodeStats):
    """What a decode did (``DecodeStats``' counts), and ``row_forwards``: the forwards each row took part
    in before it stopped, so ``tokens_per_forward`` is response tokens per forward of a live row (nothing
    after end-of-text, no frozen row counted); forwards and their time by step kind."""

    row_forwards: int = 0
    forwards: dict = field(default_factory=lambda: defaultdict(int))  # by step kind
    kind_seconds: dict = field(default_factory=lambda: defaultdict(float))  # by step kind, when timed

    @property
    def tokens_per_forward(self) -> float:
        return self.response_tokens / max(1, self.row_forwards)

    def ms_per_forward(self) -> dict:
        return {k: round(1e3 * s / self.forwards[k], 3) for k, s in self.kind_seconds.items() if self.forwards[k]}

    def add(self, other: EngineStats) -> None:
        for f in ("nfe", "forward_tokens", "response_tokens", "row_forwards", "decoded", "steps", "seconds"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for k, n in other.forwards.items():
            self.forwards[k] += n
        for k, s in other.kind_seconds.items():
            self.kind_seconds[k] += s

    def as_dict(self) -> dict:
        return {
            **super().as_dict(),
            "row_forwards": self.row_forwards,
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "forwards": dict(self.forwards),
            "ms_per_forward": self.ms_per_forward(),
        }


def compile_available() -> bool:
    """Whether ``torch.compile`` can build kernels here (a C++ compiler on CPU, Triton on CUDA)."""
    import shutil

    return bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")) or torch.cuda.is_available()


def model_forward(model, ids, pos, mask, cache, keep):
    """The one forward every step kind runs: the logits at ``keep`` (an index tensor, or the last
    ``keep`` positions) of the canvas window ``ids``, writing its keys and values into ``cache``."""
    kw = {CACHE_KW: cache, "use_cache": True} if cache is not None else {}
    return model(input_ids=ids, position_ids=pos, attention_mask=mask, logits_to_keep=keep, **kw).logits


_CODE_COPIES = itertools.count()


def _own_code(fn, tag: str):
    """``fn`` with a code object of its own (its own cache of compiled graphs)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}_{next(_CODE_COPIES)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


class DecodeEngine:
    """Decoding for one model: ``generate(prompts, decoding)`` dispatches on the model's
    conventions (causal: AR; block: cached block decoding; bidirectional: canvas recomputation).

    ``compile``: compile each step kind with ``torch.compile`` (``mode="reduce-overhead"``, CUDA
    graphs, on a GPU); the first call of each kind and width bucket pays the compile (the decode
    benchmark's warm-up reports it). ``time_kinds``: synchronise and time every forward by step
    kind (benchmarks).
    """

    def __init__(self, model, conv: Conventions, *, compile: bool = False, time_kinds: bool = False):
        self.model = model.eval()
        self.conv = conv
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.time_kinds = time_kinds
        self._caches: dict[tuple[int, int], StaticCache] = {}
        self._compile = compile
        self._steps: dict = {}  # (step kind, *shape) -> its compiled forward, one graph each (_step)
        if compile:
            import torch._dynamo

            # one graph per step kind and width bucket, never a dynamic-shape graph
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def _step(self, kind: str, shape: tuple = ()):
        """The forward of one step kind at one shape (batch, positions, cache width). Compiled, each
        gets a copy of :func:`model_forward` with its own code object, and so its own single graph:
        dynamo keeps the graphs it compiled per code object and checks each one's guards in turn on
        every call. With one graph per code object, picked here by shape, a warm call skips the
        guards (``skip_guard_eval_unsafe``: safe as no input but those keyed here changes between
        calls). Measured on the tiny teacher's AR decoding beside a DLM engine in one process:
        1,225 tokens/s with every graph behind one code object, 1,669 kept apart; skipping the
        guards cut the Python wrapper's own time per step from 73 to 24 microseconds."""
        key = (kind, *shape)
        if key not in self._steps:
            if not self._compile:
                return model_forward
            fn = _own_code(model_forward, kind)
            if self.device.type == "cuda":  # CUDA graphs: one launch a step
                compiled = torch.compile(fn, dynamic=False, mode="reduce-overhead")
            else:  # C++ calls the compiled kernels, not Python: 20% faster tiny AR steps
                compiled = torch.compile(fn, dynamic=False, options={"cpp_wrapper": True})
            self._steps[key] = compiled
            return compiled  # its first call compiles, with every guard
        compiled = self._steps[key]

        def warm(*args):
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return compiled(*args)

        return warm

    def _run(self, kind: str, stats: EngineStats, ids, pos, mask, cache, keep):
        t0 = time.perf_counter() if self.time_kinds else 0.0
        shape = (*ids.shape, mask.shape[-1], keep if isinstance(keep, int) else len(keep))
        logits = self._step(kind, shape)(self.model, ids, pos, mask, cache, keep)
        if self.time_kinds:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            stats.kind_seconds[kind] += time.perf_counter() - t0
        stats.nfe += 1
        stats.forwards[kind] += 1
        stats.forward_tokens += ids.shape[0] * ids.shape[1]
        return logits

    def _cache(self, batch: int, width: int) -> StaticCache:
        """The KV cache of ``batch`` rows over ``width`` positions. One cache is alive at a time: another
        shape's is dropped first (at Qwen3-8B, 32 rows of 1.5k positions hold about 7 GB, and a prompt set
        spans several width buckets; ``generate`` visits each bucket once and releases the cache at its end).
        It is allocated here, outside any compiled step, so that its tensors are inputs whose addresses
        stay fixed, not graph outputs."""
        key = (batch, width)
        if key not in self._caches:
            self._caches.clear()
            cfg = self.model.config
            cache = StaticCache(config=cfg, max_cache_len=width)
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            cache.early_initialization(batch, cfg.num_key_value_heads, head_dim, self.dtype, self.device)
            self._caches[key] = cache
        return self._caches[key]

    def release_cache(self) -> None:
        """Drop the KV cache (the compiled steps stay): what a job does after decoding gets the memory."""
        self._caches.clear()

    @staticmethod
    def _rewind(cache: StaticCache, to: int) -> None:
        """Set the cache's write position: the next forward writes its keys and values from ``to``."""
        for layer in cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(to)

    # ---- the canvas ---------------------------------------------------------------------------
    def _canvas(self, prompts: list[list[int]], gen_length: int, batch: int, fill: int):
        """Left-padded prompts at a bucketed width, followed by ``gen_length`` positions of ``fill``;
        the batch is padded to ``batch`` rows with copies of the last prompt."""
        rows = list(prompts) + [prompts[-1]] * (batch - len(prompts))
        width = -(-max(len(p) for p in rows) // WIDTH_BUCKET) * WIDTH_BUCKET
        ids, valid = left_pad(rows, self.conv.pad_token_id)
        pad = width - ids.shape[1]
        ids = torch.cat([torch.full((batch, pad), self.conv.pad_token_id), ids], 1)
        valid = torch.cat([torch.zeros(batch, pad, dtype=torch.long), valid], 1)
        ids = torch.cat([ids, torch.full((batch, gen_length), fill)], 1).to(self.device)
        valid = torch.cat([valid, torch.ones(batch, gen_length, dtype=torch.long)], 1).to(self.device)
        plens = torch.tensor([len(p) for p in rows], device=self.device)
        return ids, valid, plens, width

    # ---- public -------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], decoding: Decoding, *, batch_size: int | None = None
    ) -> tuple[list[list[int]], EngineStats]:
        """Decode one batch of token-id prompts (``batch_size``: the compiled batch shape, default
        the number of prompts). Returns the responses, each cut at its first end-of-text unless
        ``decoding.stop_at_eos`` is False (benchmarks then decode the full length), and the statistics."""
        batch = batch_size or len(prompts)
        if len(prompts) > batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch}")
        gen = torch.Generator(device=self.device).manual_seed(decoding.seed)
        stats = EngineStats(batch_size=batch)
        t0 = time.perf_counter()
        if self.conv.is_diffusion:
            block_size = self.conv.block_size if self.conv.attention == "block" else decoding.block_size
            if block_size is None:
                raise ValueError("a bidirectional DLM needs a decoding block size")
            d = decoding
            check_decode_args(
                d.max_new_tokens, block_size, d.threshold if d.steps_per_block is None else None, d.steps_per_block
            )
            if d.use_cache and self.conv.attention != "block":
                raise ValueError(
                    "an exact KV cache needs block attention; decode bidirectional models with use_cache=False"
                )
            rows = self._dlm(prompts, decoding, block_size, gen, stats)
        else:
            rows = self._ar(prompts, decoding, gen, stats)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.seconds = time.perf_counter() - t0
        return rows, stats

    def _responses(self, canvas: torch.Tensor, width: int, n: int, stop_at_eos: bool) -> list[list[int]]:
        out = []
        for row in canvas[:n, width:].tolist():
            row = [t for t in row if t != self.conv.mask_token_id] if self.conv.is_diffusion else row
            if stop_at_eos and self.conv.eos_token_id in row:
                row = row[: row.index(self.conv.eos_token_id)]
            out.append(row)
        return out

    # ---- AR -----------------------------------------------------------------------------------
    def _ar(self, prompts, decoding: Decoding, gen, stats: EngineStats) -> list[list[int]]:
        c, batch, n_new, stop_at_eos = self.conv, stats.batch_size, decoding.max_new_tokens, decoding.stop_at_eos
        ids, valid, _, width = self._canvas(prompts, n_new, batch, c.pad_token_id)
        pos, mask = position_ids(valid), attention_mask("causal", valid, self.dtype)
        cache = self._cache(batch, ids.shape[1])
        self._rewind(cache, 0)
        done = torch.arange(batch, device=self.device) >= len(prompts)  # batch padding never counts
        window = slice(0, width)
        for t in range(n_new):
            kind = "prefill" if t == 0 else "ar"
            logits = self._run(kind, stats, ids[:, window], pos[:, window], mask[:, :, window], cache, 1)
            tok = choose_next(logits[:, -1], decoding.temperature, decoding.top_p, gen)
            ids[:, width + t] = torch.where(done, c.pad_token_id, tok)
            if stop_at_eos:
                done |= tok == c.eos_token_id
                if bool(done.all()):  # the one host read per token
                    break
            window = slice(width + t, width + t + 1)
        rows = self._responses(ids, width, len(prompts), stop_at_eos)
        # a row took a forward for each token it returns, and one more for its end-of-text
        stats.row_forwards += sum(min(len(r) + 1, n_new) if stop_at_eos else n_new for r in rows)
        stats.response_tokens += sum(len(r) for r in rows)
        stats.decoded += stats.response_tokens
        stats.steps += stats.response_tokens
        return rows

    # ---- DLM ----------------------------------------------------------------------------------
    def _dlm(self, prompts, decoding: Decoding, bs: int, gen, stats: EngineStats) -> list[list[int]]:
        c, batch, stop_at_eos = self.conv, stats.batch_size, decoding.stop_at_eos
        threshold, steps_per_block = decoding.threshold, decoding.steps_per_block
        ids, valid, plens, width = self._canvas(prompts, decoding.max_new_tokens, batch, c.mask_token_id)
        pos = position_ids(valid)
        mode = "block" if c.attention == "block" else "bidirectional"
        mask = attention_mask(mode, valid, self.dtype, plens, bs)
        run = _Decode(self, stats, _Canvas(ids, pos, mask, width), bs, decoding.use_cache)
        done = torch.arange(batch, device=self.device) >= len(prompts)
        for start in range(width, ids.shape[1], bs):
            end, steps_left = start + bs, steps_per_block
            while True:
                logits = run.block_logits(start, done)
                tokens, conf = choose_masked(logits, c.mask_token_id, decoding.temperature, gen)
                still = (ids[:, start:end] == c.mask_token_id) & ~done[:, None]
                n_fixed = None
                if steps_per_block is not None:
                    n_fixed = (still.sum(1) + steps_left - 1) // steps_left
                    steps_left = max(1, steps_left - 1)
                pick = _pick(conf, still, threshold, n_fixed)
                run.steps += still.any(1).sum()
                run.decoded += pick.sum()
                ids[:, start:end] = torch.where(pick, tokens, ids[:, start:end])
                if stop_at_eos:
                    done |= finished(ids[:, width:end], c.eos_token_id, c.mask_token_id)
                block_open, all_done = torch.stack(
                    [((ids[:, start:end] == c.mask_token_id) & ~done[:, None]).any(), done.all()]
                ).tolist()  # the one host read per step
                if all_done or not block_open:
                    break
            if all_done:
                break
        stats.row_forwards += int(run.live)
        stats.steps += int(run.steps)
        stats.decoded += int(run.decoded)
        rows = self._responses(ids, width, len(prompts), stop_at_eos)
        stats.response_tokens += sum(len(r) for r in rows)
        return rows


class _Canvas(NamedTuple):
    """A batch's token ids (prompts left-padded, then the responses), positions, attention mask, and
    the prompts' padded width."""

    ids: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    width: int


class _Decode:
    """One DLM batch's forwards: which step kind runs over which window, and the shift's carried
    logit (the logit that predicts a block's first token comes from the last position of the block
    before, computed when that block's final keys join the cache). The carried logit is read across
    later steps, so it is a copy: a compiled step's output lives only until the next compiled step
    runs (CUDA graphs replay into the same memory; ``tests.shared.GraphReplays`` fakes it on a CPU)."""

    def __init__(self, engine: DecodeEngine, stats: EngineStats, canvas: _Canvas, bs: int, use_cache: bool):
        self.e, self.stats = engine, stats
        self.ids, self.pos, self.mask, self.width = canvas
        self.bs, self.shift = bs, engine.conv.shift
        self.live = torch.zeros((), dtype=torch.long, device=engine.device)
        self.steps, self.decoded = self.live.clone(), self.live.clone()
        self.cache = engine._cache(stats.batch_size, self.ids.shape[1]) if use_cache else None
        self.block_started, self.carry = None, None
        dev, s = engine.device, int(self.shift)
        # logit positions kept by each step kind, relative to its window
        self.keep_first = torch.arange(bs - s, 2 * bs - s, device=dev)
        self.keep_block = torch.arange(0, bs - s, device=dev)
        if self.cache is not None:
            engine._rewind(self.cache, 0)
            logits = self._forward("prefill", slice(0, self.width), 1, None)
            self.carry = logits.clone() if self.shift else None

    def _forward(self, kind, window, keep, done):
        logits = self.e._run(
            kind, self.stats, self.ids[:, window], self.pos[:, window], self.mask[:, :, window], self.cache, keep
        )
        self.live += self.ids.shape[0] if done is None else (~done).sum()
        return logits

    def block_logits(self, start: int, done) -> torch.Tensor:
        """The (B, block, V) logits predicting the block at ``start`` from the canvas as it is now."""
        bs = self.bs
        if self.cache is None:  # recompute the whole canvas, keep the block's logits
            keep = torch.arange(start - self.shift, start + bs - self.shift, device=self.e.device)
            return self._forward("canvas", slice(None), keep, done)
        first = self.block_started != start
        self.block_started = start
        if first and start > self.width:  # the finished block's final keys join the cache
            self.e._rewind(self.cache, start - bs)
            logits = self._forward("block_first", slice(start - bs, start + bs), self.keep_first, done)
            if self.shift:
                self.carry = logits[:, :1].clone()
            return logits
        if self.shift and bs == 1:  # the carried logit is the whole block's
            return self.carry
        self.e._rewind(self.cache, start)
        logits = self._forward("block", slice(start, start + bs), self.keep_block, done)
        return torch.cat([self.carry, logits], 1) if self.shift else logits


def finished(response: torch.Tensor, eos: int, mask_token: int) -> torch.Tensor:
    """Rows whose response holds end-of-text with every earlier position decoded: nothing later
    can change what they return."""
    is_eos = response == eos
    before = is_eos.cumsum(1) == 0
    return is_eos.any(1) & ~((response == mask_token) & before).any(1)


def choose_masked(logits: torch.Tensor, mask_token: int, temperature: float, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's token (argmax, or a draw at ``temperature``) and its probability; the mask
    token is never chosen."""
    logits = logits.float()
    logits[..., mask_token] = float("-inf")
    probs = torch.softmax(logits / temperature if temperature > 0 else logits, -1)
    tokens = sample_categorical(probs, gen) if temperature > 0 else probs.argmax(-1)
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)


def choose_next(logits: torch.Tensor, temperature: float, top_p: float, gen) -> torch.Tensor:
    """The next token of each row: argmax, or a draw at ``temperature`` from the nucleus ``top_p``."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        sorted_p[(sorted_p.cumsum(-1) - sorted_p) > top_p] = 0.0  # keeps at least the top token
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return sample_categorical(probs, gen)


def engine_for(model, conv: Conventions, compile: bool) -> DecodeEngine:
    """The model's decode engine for these conventions, kept on the model: every ``generate`` call of a
    process reuses its compiled steps (a new engine would compile each step kind again)."""
    engines = model.__dict__.setdefault("_ar2dlm_decode_engines", {})
    weight = next(model.parameters())
    key = (conv, compile, weight.device, weight.dtype)  # a model moved or cast gets an engine of its own
    if key not in engines:
        engines[key] = DecodeEngine(model, conv, compile=compile)
    return engines[key]


def generate(
    model,
    conv: Conventions,
    prompts: list[list[int]],
    decoding: Decoding,
    *,
    batch_size: int = 16,
    compile: bool | None = None,
) -> tuple[list[list[int]], dict]:
    """Decode with the model's own sampler, read from its conventions, through the engine: AR for
    a causal model; block decoding for a DLM (its attention block, exact prefix cache, for block
    attention; ``decoding.block_size`` decoding blocks with full recomputation for bidirectional
    ones, and ignored by block-attention models), each block unmasked by confidence ``threshold`` or,
    when ``steps_per_block`` is given, in that many steps (the cache follows the attention, whatever
    ``decoding.use_cache`` says). Batches of ``batch_size`` prompts (batch ``i`` draws from seed
    ``decoding.seed + i``; prompts are batched in order of their length, the responses returned in
    the prompts' order). ``compile`` defaults to compiling on a GPU only: on a CPU
    a compile costs more than an evaluation's decoding saves. Returns the responses (cut at
    end-of-text) and summed decoding statistics."""
    if conv.is_diffusion and conv.attention != "block" and decoding.block_size is None:
        raise ValueError("a bidirectional DLM needs a decoding block size")
    device = next(model.parameters()).device
    engine = engine_for(model, conv, device.type == "cuda" if compile is None else compile)
    batch_size = min(batch_size, len(prompts))
    # batches in order of their prompts' length: each width bucket's cache and compiled steps once
    order = sorted(range(len(prompts)), key=lambda j: len(prompts[j]))
    total, outs = EngineStats(batch_size=batch_size), [None] * len(prompts)
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="decode", mininterval=5):
            batch = replace(decoding, use_cache=conv.attention != "bidirectional", seed=decoding.seed + i)
            picked = order[i : i + batch_size]
            rows, st = engine.generate([prompts[j] for j in picked], batch, batch_size=batch_size)
            for j, row in zip(picked, rows):
                outs[j] = row
            total.add(st)
    finally:  # the engine (its compiled steps) is kept on the model; its cache is not held between calls
        engine.release_cache()
    how = {}
    if conv.is_diffusion:
        d = decoding
        how = {"block_size": conv.block_size if conv.attention == "block" else d.block_size}
        how.update({"threshold": d.threshold} if d.steps_per_block is None else {"steps_per_block": d.steps_per_block})
    return outs, {"decoder": "dlm" if conv.is_diffusion else "ar", **how, **total.as_dict()}
