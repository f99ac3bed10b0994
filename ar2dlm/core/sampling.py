"""Sampling pieces shared by every decoder (left padding, categorical draws, the unmasking rule),
and the two decoders the engine (``core/engine.py``) replaced for evaluation, kept as the decode
benchmark's baseline rows and the engine tests' references: AR through transformers'
``generate``, and DLM block decoding over a ``DynamicCache`` (also the on-policy rollouts'
sampler, which records trajectories)."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import DynamicCache, Qwen3ForCausalLM

from .attention import attention_mask, position_ids
from .conventions import Conventions, block_misfit

# transformers 5.x renamed `past_key_values` to `cache` in model forwards.
CACHE_KW = "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"


@dataclass(frozen=True)
class Decoding:
    """How responses are decoded, one value for every decoder (as ``transformers.GenerationConfig`` is
    for ``generate``): their length; for a DLM the decoding block (ignored by block-attention models,
    whose attention block it is), the confidence ``threshold`` that unmasks a position or, when
    ``steps_per_block`` is set, that many steps per block, and the exact prefix KV cache (block
    attention only); the sampling ``temperature`` (0: greedy) and nucleus ``top_p``; the ``seed``;
    whether each response stops at its first end-of-text (speed benchmarks decode the full length)."""

    max_new_tokens: int
    block_size: int | None = None
    threshold: float | None = 0.9
    steps_per_block: int | None = None
    use_cache: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True

    @classmethod
    def of(cls, spec: dict, **overrides) -> Decoding:
        """The decoding a benchmark's settings name (``max_new_tokens``, ``block_size``, ``threshold``,
        ``steps_per_block``; a setting it leaves out is None), with ``overrides``."""
        return cls(
            **{k: spec.get(k) for k in ("max_new_tokens", "block_size", "threshold", "steps_per_block")}, **overrides
        )


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
        mask[i, width - len(x) :] = 1
    return ids, mask


@torch.no_grad()
def generate_ar(
    model, tokenizer, prompts: list[list[int]], decoding: Decoding, batch_size: int = 16
) -> list[list[int]]:
    """Generate continuations of token-id prompts through transformers' ``generate`` (sampled when
    ``decoding.temperature`` > 0); each result is cut at the first end-of-text (with ``stop_at_eos``
    False every row runs to ``max_new_tokens``, for benchmarks)."""
    model.eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    max_new_tokens, temperature = decoding.max_new_tokens, decoding.temperature
    torch.manual_seed(decoding.seed)
    out: list[list[int]] = []
    for i in tqdm(range(0, len(prompts), batch_size), desc="generate", mininterval=5):
        ids, mask = (t.to(model.device) for t in left_pad(prompts[i : i + batch_size], pad))
        sampled = {"do_sample": True, "temperature": temperature, "top_p": decoding.top_p}
        kwargs = sampled if temperature > 0 else {"do_sample": False}
        if not decoding.stop_at_eos:
            kwargs["min_new_tokens"] = max_new_tokens
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            **kwargs,
        )
        for row in gen[:, ids.shape[1] :].tolist():
            out.append(row[: row.index(eos)] if decoding.stop_at_eos and eos in row else row)
    return out


@dataclass
class DecodeStats:
    """NFE = forward passes; tokens count response tokens up to end-of-text only."""

    nfe: int = 0
    forward_tokens: int = 0  # positions the forward passes ran over, summed over rows (FLOPs ~ 2 x params x this)
    steps: int = 0  # unmasking steps summed over rows (a row steps while its block has masks)
    decoded: int = 0  # positions unmasked (a block is decoded whole, end-of-text or not)
    response_tokens: int = 0
    seconds: float = 0.0
    batch_size: int = 0

    @property
    def tokens_per_step(self) -> float:
        return self.decoded / max(1, self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.response_tokens / max(1e-9, self.seconds)

    def as_dict(self) -> dict:
        return {
            "nfe": self.nfe,
            "forward_tokens": self.forward_tokens,
            "steps": self.steps,
            "decoded": self.decoded,
            "response_tokens": self.response_tokens,
            "seconds": round(self.seconds, 4),
            "batch_size": self.batch_size,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
        }


@dataclass
class Trajectory:
    """What generate_dlm did, for on-policy training: the final canvas (left-padded prompt +
    response), its validity and prompt lengths, and the block's contents before every step."""

    canvas: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    prompt_lens: torch.Tensor | None = None
    states: list = None  # (block start, (B, block) tokens before the step)
    forward_tokens: int = 0  # what the decoding's forward passes ran over (DecodeStats.forward_tokens)


def sample_categorical(probs: torch.Tensor, gen: torch.Generator | list[torch.Generator]) -> torch.Tensor:
    """One draw from each row of ``probs`` (last dimension) by inverse CDF: one uniform per row.
    By hand because ``torch.multinomial`` draws one exponential per vocabulary entry (with or
    without replacement): at 64 positions x 151,936 tokens, 170-280 ms per step on a CPU core
    against ~20 ms here, most of a decoding step of a small model at Qwen3's vocabulary. ``gen``
    may be one generator per index of the first dimension (a sequence's draws then depend on its
    own generator only, not on the batch it decodes in)."""
    cdf = probs.cumsum(-1)
    shape, kw = (*probs.shape[:-1], 1), {"device": probs.device, "dtype": cdf.dtype}
    if isinstance(gen, torch.Generator):
        u = torch.rand(*shape, generator=gen, **kw)
    else:
        u = torch.stack([torch.rand(*shape[1:], generator=g, **kw) for g in gen])
    u = u * cdf[..., -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def check_decode_args(gen_length: int, block_size: int, threshold: float | None, steps_per_block: int | None):
    if problem := block_misfit(block_size, gen_length, "the generation length"):
        raise ValueError(problem)
    if threshold is not None and not 0 < threshold <= 1:
        raise ValueError(f"confidence threshold {threshold} is outside (0, 1]")
    if threshold is None and not steps_per_block:
        raise ValueError("give a confidence threshold or a number of steps per block")
    if steps_per_block is not None and not 1 <= steps_per_block <= block_size:
        raise ValueError(f"steps per block {steps_per_block} must lie in [1, block size {block_size}]")


def _pick(
    conf: torch.Tensor, still: torch.Tensor, threshold: float | None, n_fixed: torch.Tensor | None
) -> torch.Tensor:
    """Which masked positions to unmask this step: the most confident one plus all at or above
    the threshold, or the ``n_fixed`` most confident ones per row."""
    conf = conf.masked_fill(~still, -1.0)
    top = torch.zeros_like(still)
    top.scatter_(1, conf.argmax(1, keepdim=True), True)
    if n_fixed is not None:
        order = conf.argsort(1, descending=True).argsort(1)
        chosen = order < n_fixed.view(-1, 1)
    else:
        chosen = conf >= threshold
    return (chosen | top) & still


@torch.no_grad()
def generate_dlm(
    model,
    conv: Conventions,
    prompts: list[list[int]],
    decoding: Decoding,
    *,
    trajectory: Trajectory | None = None,
    row_seeds: list[int] | None = None,
) -> tuple[list[list[int]], DecodeStats]:
    """Semi-autoregressive confidence decoding of a DLM over transformers' ``DynamicCache``: the
    path the decode engine (``core/engine.py``) replaced for evaluation, kept as the benchmark's
    baseline row, the engine tests' reference and the on-policy rollouts' sampler (it records a
    ``trajectory`` and draws each row from its own generator).

    The response starts fully masked and is decoded block by block, left to right. With block
    attention the attention blocks are the decoding blocks (prompt = block 0), and ``use_cache``
    keeps an exact prefix KV cache of the prompt and finished blocks: each step runs only the
    current block. Without a cache every step recomputes the whole canvas (prompt + response).
    Each row is cut at its first end-of-text; a row whose finished blocks hold one leaves the
    batch (its later blocks would be cut anyway), and decoding stops once every row has one
    (unless ``stop_at_eos`` is False: benchmarks and recorded trajectories decode the full length).
    Sampling (``temperature`` > 0) draws from one generator seeded with ``seed``, or with
    ``row_seeds`` from one generator per prompt: each row's tokens then do not depend on the
    other rows of the batch (a sharded run's rollouts equal one process's).
    """
    gen_length, block_size, threshold = decoding.max_new_tokens, decoding.block_size, decoding.threshold
    steps_per_block, temperature = decoding.steps_per_block, decoding.temperature
    check_decode_args(gen_length, block_size, threshold if steps_per_block is None else None, steps_per_block)
    if not conv.is_diffusion:
        raise ValueError("generate_dlm decodes diffusion models; this checkpoint is causal (use generate_ar)")
    if decoding.use_cache and conv.attention != "block":
        raise ValueError("an exact KV cache needs block attention; decode bidirectional models with use_cache=False")
    model.eval()
    t0 = time.perf_counter()
    d = _DynamicDecode(model, conv, prompts, decoding, row_seeds, trajectory)
    for start in range(d.P, d.P + gen_length, block_size):
        end, n_steps_left = start + block_size, steps_per_block
        while True:
            still = d.ids[:, start:end] == conv.mask_token_id
            if not still.any():
                break
            if trajectory is not None:
                trajectory.states.append((start, d.ids[:, start:end].clone()))
            logits = d.block_logits(start, end)
            d.stats.nfe += 1
            d.stats.steps += int(still.any(1).sum())
            # The mask token is never a decoded token: each step then fills at least one position.
            logits = logits.float()
            logits[..., conv.mask_token_id] = float("-inf")
            probs = torch.softmax(logits / temperature, -1) if temperature > 0 else torch.softmax(logits, -1)
            tokens = sample_categorical(probs, d.gen) if temperature > 0 else probs.argmax(-1)
            conf = probs.gather(-1, tokens[..., None]).squeeze(-1)
            n_fixed = None
            if steps_per_block is not None:
                n_fixed = (still.sum(1) + n_steps_left - 1) // n_steps_left
                n_steps_left = max(1, n_steps_left - 1)
            pick = _pick(conf, still, threshold, n_fixed)
            d.stats.decoded += int(pick.sum())
            d.ids[:, start:end] = torch.where(pick, tokens, d.ids[:, start:end])
        d.pending = start  # its exact keys/values join the cache with the next block's first step
        if decoding.stop_at_eos and d.leave_finished(end):
            break
    return d.finish(decoding.stop_at_eos, t0)


class _DynamicDecode:
    """One batch of :func:`generate_dlm`: the canvas, the rows still decoding, the cache and the
    shift's carried logit."""

    def __init__(self, model, conv, prompts, decoding: Decoding, row_seeds, trajectory):
        gen_length, block_size = decoding.max_new_tokens, decoding.block_size
        self.model, self.conv, self.block_size, self.trajectory = model, conv, block_size, trajectory
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(decoding.seed)
        if row_seeds is not None:
            if len(row_seeds) != len(prompts):
                raise ValueError(f"{len(row_seeds)} row seeds for {len(prompts)} prompts")
            self.gen = [torch.Generator(device=device).manual_seed(s) for s in row_seeds]
        self.stats = DecodeStats(batch_size=len(prompts))
        ids, valid = left_pad(prompts, conv.pad_token_id)
        B, P = ids.shape
        self.P, self.width = P, P + gen_length
        self.ids = torch.cat([ids, torch.full((B, gen_length), conv.mask_token_id)], 1).to(device)
        valid = torch.cat([valid, torch.ones(B, gen_length, dtype=torch.long)], 1).to(device)
        plens = torch.tensor([len(p) for p in prompts], device=device)
        self.pos = position_ids(valid)
        self.mode = "block" if conv.attention == "block" else "bidirectional"
        self.mask = attention_mask(self.mode, valid, dtype, plens, block_size)
        if trajectory is not None:
            trajectory.valid, trajectory.prompt_lens, trajectory.states = valid, plens, []
        self.final = self.ids.clone()  # rows are written back here as they leave the batch
        self.live = torch.arange(B, device=device)  # the rows still decoding
        self.cache, self.carry, self.pending = None, None, None
        if decoding.use_cache:
            self.cache = DynamicCache()
            self.carry = self._forward(0, P, P).logits[:, -1:]
            self.stats.nfe += 1

    def _forward(self, lo: int, end: int, kv: int):
        self.stats.forward_tokens += len(self.ids) * (end - lo)
        return self.model(
            input_ids=self.ids[:, lo:end],
            position_ids=self.pos[:, lo:end],
            attention_mask=self.mask[:, :, lo:end, :kv],
            **{CACHE_KW: self.cache},
            use_cache=True,
        )

    def block_logits(self, start: int, end: int) -> torch.Tensor:
        """The logits predicting the block [start, end) from the canvas as it is now."""
        if self.cache is None:
            width = end if self.mode == "block" else self.width
            lo = start - 1 if self.conv.shift else start
            self.stats.forward_tokens += len(self.ids) * width
            # logits of the block only: the whole canvas's would be rows x width x vocabulary
            return self.model(
                input_ids=self.ids[:, :width],
                position_ids=self.pos[:, :width],
                attention_mask=self.mask[:, :, :width, :width],
                logits_to_keep=torch.arange(lo, lo + self.block_size, device=self.device),
            ).logits
        # The previous block's final keys/values are appended in the same forward as this
        # block's first step (its queries cannot see this block), saving a pass per block.
        lo = start if self.pending is None else self.pending
        out = self._forward(lo, end, end)
        self.cache.crop(start - self.cache.get_seq_length())  # keep the finished blocks only (negative = remove)
        if self.pending is not None:
            self.carry, self.pending = out.logits[:, start - lo - 1 : start - lo], None
        logits = out.logits[:, start - lo :]
        return torch.cat([self.carry, logits[:, :-1]], 1) if self.conv.shift else logits

    def leave_finished(self, end: int) -> bool:
        """Rows whose finished blocks hold end-of-text leave the batch; True once none is left."""
        done = (self.ids[:, self.P : end] == self.conv.eos_token_id).any(1)
        if done.all():
            return True
        if done.any() and self.trajectory is None:
            # Finished rows leave the batch: each later step runs only the rows still decoding.
            self.final[self.live[done]] = self.ids[done]
            keep = (~done).nonzero().squeeze(1)
            self.live, self.ids, self.pos, self.mask = self.live[keep], self.ids[keep], self.pos[keep], self.mask[keep]
            if isinstance(self.gen, list):
                self.gen = [self.gen[i] for i in keep.tolist()]
            if self.cache is not None:
                self.cache.batch_select_indices(keep)
                self.carry = self.carry[keep]
        return False

    def finish(self, stop_at_eos: bool, t0: float) -> tuple[list[list[int]], DecodeStats]:
        self.final[self.live] = self.ids
        if self.trajectory is not None:
            self.trajectory.canvas, self.trajectory.forward_tokens = self.final, self.stats.forward_tokens
        results = []
        for row in self.final[:, self.P :].tolist():
            row = [t for t in row if t != self.conv.mask_token_id]  # undecoded blocks after an early stop
            if stop_at_eos and self.conv.eos_token_id in row:
                row = row[: row.index(self.conv.eos_token_id)]
            results.append(row)
        self.stats.response_tokens = sum(len(r) for r in results)
        self.stats.seconds = time.perf_counter() - t0
        return results, self.stats
