"""Attention modes as 4D additive masks that HF Qwen3 honours under ``sdpa`` and ``eager``.

transformers returns a 4D ``attention_mask`` as-is, so a DLM is the same Qwen3 module with a
different mask: no model surgery. Masks are additive (0 = attend, dtype minimum = blocked) because
the eager path adds the mask to the scores; a boolean mask would only work under sdpa.

Block structure: the prompt is block 0 (clean context, bidirectional within itself); response token
k is in block ``1 + k // block_size``. Padding is block -1 and is never attended to.
"""

from __future__ import annotations

import torch

from .conventions import ATTENTION_MODES


def position_ids(valid: torch.Tensor) -> torch.Tensor:
    """Position of each token among the valid (non-padding) tokens of its row; 0 on padding."""
    return (valid.long().cumsum(-1) - 1).clamp(min=0)


def block_ids(valid: torch.Tensor, prompt_lens: torch.Tensor | None, block_size: int) -> torch.Tensor:
    """Block index per token: 0 for the prompt, 1 + k // block_size for response token k, -1 on padding."""
    pos = position_ids(valid)
    plen = torch.zeros(valid.shape[0], 1, dtype=torch.long, device=valid.device) if prompt_lens is None \
        else prompt_lens.view(-1, 1).to(valid.device)
    blocks = torch.where(pos < plen, torch.zeros_like(pos), 1 + (pos - plen).div(block_size, rounding_mode="floor"))
    return torch.where(valid.bool(), blocks, torch.full_like(blocks, -1))


def visibility(mode: str, q_pos, k_pos, k_valid, q_block=None, k_block=None) -> torch.Tensor:
    """Boolean (B, Q, K): may query q attend to key k. Positions are indices along the sequence."""
    if mode not in ATTENTION_MODES:
        raise ValueError(f"unknown attention mode {mode!r} (known: {', '.join(ATTENTION_MODES)})")
    keep = k_valid.bool()[:, None, :]
    if mode == "causal":
        keep = keep & (k_pos[:, None, :] <= q_pos[:, :, None])
    elif mode == "block":
        keep = keep & (k_block[:, None, :] <= q_block[:, :, None])
    return keep


def additive(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) boolean -> (B, 1, Q, K) additive mask in ``dtype``."""
    bias = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    bias.masked_fill_(~keep, torch.finfo(dtype).min)
    return bias[:, None]


def attention_mask(mode: str, valid: torch.Tensor, dtype: torch.dtype = torch.float32,
                   prompt_lens: torch.Tensor | None = None, block_size: int | None = None) -> torch.Tensor:
    """Full-sequence 4D mask for ``mode`` over a (B, T) batch whose ``valid`` marks non-padding."""
    idx = torch.arange(valid.shape[1], device=valid.device).expand(valid.shape)
    blocks = block_ids(valid, prompt_lens, block_size) if mode == "block" else None
    return additive(visibility(mode, idx, idx, valid, blocks, blocks), dtype)


def two_copy_inputs(clean: torch.Tensor, noisy: torch.Tensor, valid: torch.Tensor, prompt_lens: torch.Tensor | None,
                    block_size: int, dtype: torch.dtype = torch.float32):
    """Efficient-DLM's 2L training layout: clean and noisy copies side by side.

    Returns (input_ids (B, 2T), position_ids (B, 2T), 4D mask). Clean queries attend block-causally
    to clean keys; a noisy query in block b attends to clean keys of blocks < b and to noisy keys of
    block b. Both halves share position ids, so the noisy half's outputs equal those of running
    clean prefix + noisy block directly.
    """
    T = clean.shape[1]
    blocks = block_ids(valid, prompt_lens, block_size)
    valid2 = torch.cat([valid, valid], 1).bool()
    b2 = torch.cat([blocks, blocks], 1)
    is_noisy = torch.zeros_like(valid2)
    is_noisy[:, T:] = True
    qb, kb = b2[:, :, None], b2[:, None, :]
    qn, kn = is_noisy[:, :, None], is_noisy[:, None, :]
    keep = valid2[:, None, :] & (
        (~qn & ~kn & (kb <= qb))  # clean -> clean, block-causal
        | (qn & ~kn & (kb < qb))  # noisy -> earlier clean blocks
        | (qn & kn & (kb == qb))  # noisy -> its own noisy block
    )
    pos = position_ids(valid)
    return torch.cat([clean, noisy], 1), torch.cat([pos, pos], 1), additive(keep, dtype)
