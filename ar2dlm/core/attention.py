"""Attention modes, defined once as flex-attention ``mask_mod`` rules and materialised either as
4D additive masks (CPU, ``sdpa`` and ``eager``) or as a flex attention ``BlockMask`` (GPU,
``attn_implementation="flex_attention"``, the memory-efficient route).

transformers returns a 4D ``attention_mask`` (tensor or BlockMask) as-is, so a DLM is the same
Qwen3 module with a different mask: no model surgery. Dense masks are additive (0 = attend,
dtype minimum = blocked) because the eager path adds the mask to the scores.

Block structure: the prompt is block 0 (clean context, bidirectional within itself); response token
k is in block ``1 + k // block_size``. Padding is block -1 and is never attended to.
"""

from __future__ import annotations

import functools

import torch

from .conventions import ATTENTION_MODES


def position_ids(valid: torch.Tensor) -> torch.Tensor:
    """Position of each token among the valid (non-padding) tokens of its row; 0 on padding."""
    return (valid.long().cumsum(-1) - 1).clamp(min=0)


def block_ids(valid: torch.Tensor, prompt_lens: torch.Tensor | None, block_size: int) -> torch.Tensor:
    """Block index per token: 0 for the prompt, 1 + k // block_size for response token k, -1 on padding."""
    pos = position_ids(valid)
    plen = (
        torch.zeros(valid.shape[0], 1, dtype=torch.long, device=valid.device)
        if prompt_lens is None
        else prompt_lens.view(-1, 1).to(valid.device)
    )
    blocks = torch.where(pos < plen, torch.zeros_like(pos), 1 + (pos - plen).div(block_size, rounding_mode="floor"))
    return torch.where(valid.bool(), blocks, torch.full_like(blocks, -1))


def mask_mod(
    mode: str,
    valid: torch.Tensor,
    prompt_lens: torch.Tensor | None = None,
    block_size: int | None = None,
    two_copy: bool = False,
):
    """The rule ``mod(b, h, q, k) -> may q attend to k`` for a (B, T) batch.

    ``two_copy`` is Efficient-DLM's 2L layout (clean copy then noisy copy, length 2T, block mode):
    clean queries attend block-causally to clean keys; a noisy query in block b attends to clean
    keys of blocks < b and to noisy keys of block b.
    """
    if mode not in ATTENTION_MODES:
        raise ValueError(f"unknown attention mode {mode!r} (known: {', '.join(ATTENTION_MODES)})")
    valid = valid.bool()
    if mode == "causal":
        return lambda b, h, q, k: valid[b, k] & (k <= q)
    if mode == "bidirectional":
        return lambda b, h, q, k: valid[b, k]
    if block_size is None:
        raise ValueError("block attention needs a block size")
    blocks = block_ids(valid, prompt_lens, block_size)
    if not two_copy:
        return lambda b, h, q, k: valid[b, k] & (blocks[b, k] <= blocks[b, q])
    T = valid.shape[1]
    valid2, blocks2 = torch.cat([valid, valid], 1), torch.cat([blocks, blocks], 1)

    def mod(b, h, q, k):
        qn, kn = q >= T, k >= T
        qb, kb = blocks2[b, q], blocks2[b, k]
        return valid2[b, k] & ((~qn & ~kn & (kb <= qb)) | (qn & ~kn & (kb < qb)) | (qn & kn & (kb == qb)))

    return mod


def dense(mod, batch: int, q_len: int, kv_len: int, dtype: torch.dtype, device=None, q_offset: int = 0) -> torch.Tensor:
    """Evaluate ``mod`` on the full grid: a (B, 1, Q, K) additive mask."""
    b = torch.arange(batch, device=device)[:, None, None]
    q = torch.arange(q_offset, q_offset + q_len, device=device)[None, :, None]
    k = torch.arange(kv_len, device=device)[None, None, :]
    keep = mod(b, 0, q, k)
    bias = torch.zeros(keep.shape, dtype=dtype, device=device)
    bias.masked_fill_(~keep, torch.finfo(dtype).min)
    return bias[:, None]


@functools.cache
def _create_block_mask():
    """flex attention's ``create_block_mask`` compiled, as its documentation advises: the mask is then
    evaluated block by block, where the eager function evaluates it on the dense (B, 1, L, L) grid first
    (64 MB for two rows of the 2L layout at L = 2048: tests/test_attention.py)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def build_mask(mod, batch: int, length: int, dtype: torch.dtype, device=None, flex: bool = False):
    """A 4D additive mask, or a flex attention BlockMask when ``flex``."""
    if flex:
        return _create_block_mask()(mod, B=batch, H=None, Q_LEN=length, KV_LEN=length, device=device)
    return dense(mod, batch, length, length, dtype, device)


def attention_mask(
    mode: str,
    valid: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    prompt_lens: torch.Tensor | None = None,
    block_size: int | None = None,
    flex: bool = False,
):
    """Full-sequence mask for ``mode`` over a (B, T) batch whose ``valid`` marks non-padding."""
    mod = mask_mod(mode, valid, prompt_lens, block_size)
    return build_mask(mod, valid.shape[0], valid.shape[1], dtype, valid.device, flex)


def two_copy_inputs(
    clean: torch.Tensor,
    noisy: torch.Tensor,
    valid: torch.Tensor,
    prompt_lens: torch.Tensor | None,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    flex: bool = False,
):
    """Efficient-DLM's 2L training layout: (input_ids (B, 2T), position_ids (B, 2T), mask).

    Both halves share position ids, so the noisy half's outputs equal those of running the clean
    prefix + the noisy block directly.
    """
    mod = mask_mod("block", valid, prompt_lens, block_size, two_copy=True)
    pos = position_ids(valid)
    mask = build_mask(mod, clean.shape[0], 2 * clean.shape[1], dtype, clean.device, flex)
    return torch.cat([clean, noisy], 1), torch.cat([pos, pos], 1), mask


def set_training_attention(model, device: torch.device) -> None:
    """The attention kernel a model trains with: flex attention on CUDA (block and 2L masks as
    BlockMasks, never materialised), eager on CPU. Eager rather than sdpa on CPU because torch
    2.13's CPU sdpa kernel with an explicit mask spends ~8x its forward time in the backward pass
    (measured 27 vs 3.6 ms per layer at 16 x 4 heads x 208 x 48), so eager trains the tiny preset's
    mdlm, repr_align and efficient_dlm steps 15-25% faster. Only the kernel changes: a saved
    checkpoint's config does not record it, so evaluation loads the library default."""
    model.set_attn_implementation("flex_attention" if device.type == "cuda" else "eager")


def uses_flex(model) -> bool:
    model = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    return getattr(model.config, "_attn_implementation", None) == "flex_attention"
