"""Masked diffusion: noising, model outputs aligned to token positions, loss.

MDLM / LLaDA form: t ~ U(eps, 1); each eligible token is masked with probability p (= t for
uniform masking); cross-entropy on masked tokens weighted by 1/p, divided by the number of eligible
tokens. Prompt and padding tokens are never eligible. Block attention draws one t per block.

Position-dependent masking (Efficient-DLM): inside a block of size B, token at offset j has
p = t ** exp(-beta * (u - 1/2)), u = (j + 1/2) / B. beta = 0 is uniform masking; beta > 0 masks
the end of a block more than its start, most strongly at low noise (t -> 1 masks everything either
way), floored at eps as t is. This is our parametrisation of the paper's half-life schedule; the 1/p
weight keeps the loss an ELBO for any beta, and the floor keeps every weight at most 1/eps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .attention import attention_mask, block_ids, position_ids, two_copy_inputs, uses_flex
from .conventions import Conventions


@dataclass
class NoisedBatch:
    clean: torch.Tensor  # (B, T) token ids
    noisy: torch.Tensor  # (B, T) with masked positions set to the mask id
    masked: torch.Tensor  # (B, T) bool
    weight: torch.Tensor  # (B, T) 1/p on masked tokens, 0 elsewhere
    eligible: torch.Tensor  # (B, T) bool: tokens that may be masked (response, non-padding)
    valid: torch.Tensor  # (B, T) non-padding
    prompt_lens: torch.Tensor  # (B,)
    prob: torch.Tensor  # (B, T) masking probability of each eligible token

    def select(self, rows: torch.Tensor) -> NoisedBatch:
        """The given rows (a process's share of a batch whose masks were drawn for every row)."""
        return NoisedBatch(*(getattr(self, f.name)[rows] for f in fields(self)))


def _rand(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform draws from the generator's own device (the seeded stream does not depend on where
    the model runs), moved to ``device``."""
    gen_device = generator.device if generator is not None else "cpu"
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def collate(rows: list[tuple[list[int], int]], pad_id: int, fill_id: int | None = None):
    """Right-pad to the longest row: (ids, valid, prompt_lens). With ``fill_id`` (end-of-text), a
    row that ends with it is filled with it to the longest row instead, the fill valid and trained
    on like any token (LLaDA's SFT recipe): a model decoding a canvas longer than its answer learns
    to fill the rest with end-of-text; a row cut short (no end-of-text) is padded as usual."""
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros_like(ids)
    for i, (r, _) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        valid[i, : len(r)] = 1
        if fill_id is not None and r[-1] == fill_id:
            ids[i, len(r) :] = fill_id
            valid[i, len(r) :] = 1
    return ids, valid, torch.tensor([p for _, p in rows])


def eligible_tokens(valid: torch.Tensor, prompt_lens: torch.Tensor, shift: bool) -> torch.Tensor:
    """Response tokens; with shift the first valid token has no predecessor and is never a target."""
    pos = position_ids(valid)
    elig = valid.bool() & (pos >= prompt_lens.view(-1, 1))
    if shift:
        elig &= pos >= 1
    return elig


def masking_probs(valid, prompt_lens, conv: Conventions, beta: float, eps: float, generator) -> torch.Tensor:
    B, T = valid.shape
    if conv.attention == "block":
        blocks = block_ids(valid, prompt_lens, conv.block_size).clamp(min=0)
        t_blocks = eps + (1 - eps) * _rand((B, int(blocks.max()) + 1), generator, valid.device)
        t = t_blocks.gather(1, blocks)
    else:
        t = (eps + (1 - eps) * _rand((B, 1), generator, valid.device)).expand(B, T)
    if beta == 0:
        return t
    if conv.block_size is None:
        raise ValueError("position-dependent masking needs a block size")
    offset = (position_ids(valid) - prompt_lens.view(-1, 1)).remainder(conv.block_size)
    u = (offset.float() + 0.5) / conv.block_size
    # floored at eps, as uniform masking's t: unfloored, the first offsets reach p ~ 1e-8 near t = eps (weight
    # 1/p ~ 1e8; benchmarks/masking_weight.py: block 32, gradient-norm sd 9.7 -> 5.6 with the floor, largest
    # over median 44 -> 17). The loss stays unbiased for the schedule it samples (mask and weight use the same p).
    return t.pow(torch.exp(-beta * (u - 0.5))).clamp(min=eps)


def item_seed(seed: int, index: int) -> int:
    """The generator seed of item ``index`` (a row, a pair, a step) of a stream seeded by ``seed``:
    distinct for every seed and index below 1,000,003 (a prime)."""
    return seed * 1_000_003 + index


def noise(
    clean: torch.Tensor,
    valid: torch.Tensor,
    prompt_lens: torch.Tensor,
    conv: Conventions,
    *,
    beta: float = 0.0,
    eps: float = 1e-3,
    generator: torch.Generator | None = None,
    complement_of: NoisedBatch | None = None,
) -> NoisedBatch:
    """Mask eligible tokens of ``clean``. ``complement_of`` masks exactly the eligible tokens that
    batch left unmasked (with probabilities 1 - p): the antithetic half of a complementary pair."""
    elig = eligible_tokens(valid, prompt_lens, conv.shift)
    if complement_of is not None:
        prob = (1 - complement_of.prob).clamp(min=eps)
        masked = elig & ~complement_of.masked
    else:
        prob = masking_probs(valid, prompt_lens, conv, beta, eps, generator)
        masked = elig & (_rand(clean.shape, generator, clean.device) < prob)
    noisy = torch.where(masked, torch.full_like(clean, conv.mask_token_id), clean)
    weight = torch.where(masked, 1.0 / prob, torch.zeros_like(prob))
    return NoisedBatch(clean, noisy, masked, weight, elig, valid, prompt_lens, prob)


def source_positions(batch: NoisedBatch, conv: Conventions) -> torch.Tensor:
    """(B, T): the position in the model's input whose output predicts token i. The noisy copy's
    under block attention (the 2L layout: clean copy then noisy copy); with shift, the position
    before i, which at the first token of a block is the clean copy's last token of the previous
    block (what the cached sampler sees at inference)."""
    B, T = batch.clean.shape
    idx = torch.arange(T, device=batch.clean.device).expand(B, T)
    prev = (idx - 1).clamp(min=0)
    if conv.attention != "block":
        return prev if conv.shift else idx
    if not conv.shift:
        return T + idx
    blocks = block_ids(batch.valid, batch.prompt_lens, conv.block_size)
    same = torch.zeros_like(batch.valid, dtype=torch.bool)
    same[:, 1:] = blocks[:, 1:] == blocks[:, :-1]
    return torch.where(same, T + prev, prev)


def logits_at(model, where: torch.Tensor, source: torch.Tensor, length: int, **inputs):
    """Run ``model`` on ``inputs`` (sequence length ``length``) projecting to the vocabulary only
    the input positions ``source[where]`` (transformers' boolean ``logits_to_keep``): returns
    (logits (N, V) in the row-major order of ``where``'s positions, outputs). At a 151,936-token
    vocabulary the logits of every position are the largest tensor of a step; a loss reads a few."""
    rows, cols = where.nonzero(as_tuple=True)
    src = source[rows, cols]
    keep = torch.zeros(where.shape[0], length, dtype=torch.bool, device=where.device)
    keep[rows, src] = True
    out = model(**inputs, logits_to_keep=keep)
    order = keep.flatten().cumsum(0) - 1  # row of each kept position in the model's (N, V) output
    logits = _TakeRows.apply(out.logits.flatten(0, -2), order[rows * length + src])
    out["logits"] = None  # the model's order is not kept (one (N, V) tensor lives on, not two); as an
    # item, since ModelOutput keeps its item when an attribute is set to None
    return logits, out


class _TakeRows(torch.autograd.Function):
    """``x[index]`` along the first dimension. Written by hand for its backward: autograd's index
    backward builds a zero tensor and an out-of-place copy of it (with the incoming gradient, three
    (N, V) tensors at once, as ``ar2dlm.plan.trace`` measured); this one adds into one zero gradient
    in place."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return x[index]

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.shape).index_add_(0, index, grad), None


def forward_aligned(
    model, batch: NoisedBatch, conv: Conventions, output_hidden_states: bool = False, where: torch.Tensor | None = None
):
    """Run the model in its attention mode on the noisy batch; return (logits, outputs) where
    ``logits[:, i]`` (B, T, V) is the prediction for token i under the shift convention, or, with
    ``where`` (B, T bool), the predictions of those tokens only: (N, V) in row-major order.

    Block attention uses the 2L layout (clean copy + noisy copy, :func:`source_positions`).
    """
    if conv.attention not in ("block", "bidirectional"):
        raise ValueError(f"a diffusion forward needs bidirectional or block attention, not {conv.attention!r}")
    dtype = next(model.parameters()).dtype
    B, T = batch.clean.shape
    if conv.attention == "block":
        ids, pos, mask = two_copy_inputs(
            batch.clean, batch.noisy, batch.valid, batch.prompt_lens, conv.block_size, dtype, flex=uses_flex(model)
        )
    else:
        ids, pos = batch.noisy, position_ids(batch.valid)
        mask = attention_mask("bidirectional", batch.valid, dtype, flex=uses_flex(model))
    inputs = dict(input_ids=ids, position_ids=pos, attention_mask=mask, output_hidden_states=output_hidden_states)
    source = source_positions(batch, conv)
    if where is not None:
        return logits_at(model, where, source, ids.shape[1], **inputs)
    out = model(**inputs)
    return out.logits[torch.arange(B, device=ids.device)[:, None], source], out


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (B, T) in fp32."""
    return torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


def chunked_rows(fn, *rows: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``fn`` over row chunks of ``rows`` (tensors with the same first dimension), concatenated.
    Under autograd each chunk is recomputed in the backward pass, so a step keeps only the inputs
    (e.g. bf16 logits) rather than fp32 copies and log-softmaxes of the whole vocabulary, and the
    inputs' gradients are written into one buffer each."""
    if rows[0].shape[0] <= chunk:
        return fn(*rows)
    if torch.is_grad_enabled() and any(r.requires_grad for r in rows):
        return _ChunkedRows.apply(fn, chunk, *rows)
    return torch.cat([fn(*(r[i : i + chunk] for r in rows)) for i in range(0, rows[0].shape[0], chunk)])


class _ChunkedRows(torch.autograd.Function):
    """:func:`chunked_rows` under autograd. Written by hand because checkpointing each chunk of a
    slice (``torch.utils.checkpoint``) makes every chunk's backward allocate a zero gradient of the
    whole input and add it to the running sum: three (N, V) tensors at a step's peak instead of the
    input and its gradient (measured by ``ar2dlm.plan.trace``); the backward here recomputes each
    chunk and writes its gradient into its rows."""

    @staticmethod
    def forward(ctx, fn, chunk, *rows):
        ctx.fn, ctx.chunk = fn, chunk
        device = rows[0].device.type
        ctx.autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), device)
        ctx.save_for_backward(*rows)
        return torch.cat([fn(*(r[i : i + chunk] for r in rows)) for i in range(0, rows[0].shape[0], chunk)])

    @staticmethod
    def backward(ctx, grad):
        rows = ctx.saved_tensors
        wanted = ctx.needs_input_grad[2:]
        grads = [torch.empty_like(r) if w else None for r, w in zip(rows, wanted)]
        enabled, dtype, device = ctx.autocast
        for i in range(0, rows[0].shape[0], ctx.chunk):
            part = [r[i : i + ctx.chunk].detach().requires_grad_(w) for r, w in zip(rows, wanted)]
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
                out = ctx.fn(*part)
            inputs = [p for p in part if p.requires_grad]
            got = iter(torch.autograd.grad(out, inputs, grad[i : i + ctx.chunk], allow_unused=True))
            for g in grads:
                if g is not None:
                    part_grad = next(got)
                    g[i : i + ctx.chunk] = 0 if part_grad is None else part_grad
        return (None, None, *grads)


def _nll_rows(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")


def selected_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (N,) in fp32 of selected positions' logits (N, V), computed in chunks."""
    return chunked_rows(_nll_rows, logits, targets)


def diffusion_loss(
    logits: torch.Tensor, batch: NoisedBatch, weighted: bool = True, eligible: torch.Tensor | None = None
) -> torch.Tensor:
    """Masked cross-entropy, weighted by 1/p (or unweighted), over the number of eligible tokens
    (``eligible``: of the whole batch, when ``batch`` is one process's share of it). ``logits``:
    those of the masked tokens, (N, V) (``forward_aligned(..., where=batch.masked)``)."""
    w = batch.weight[batch.masked] if weighted else 1.0
    nll = selected_nll(logits, batch.clean[batch.masked])
    return (nll * w).sum() / (batch.eligible.sum() if eligible is None else eligible).clamp(min=1)
