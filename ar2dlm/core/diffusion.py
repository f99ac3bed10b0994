"""Masked diffusion: noising, model outputs aligned to token positions, loss.

MDLM / LLaDA form: t ~ U(eps, 1); each eligible token is masked with probability p (= t for
uniform masking); cross-entropy on masked tokens weighted by 1/p, divided by the number of eligible
tokens. Prompt and padding tokens are never eligible. Block attention draws one t per block.

Position-dependent masking (Efficient-DLM): inside a block of size B, token at offset j has
p = t ** exp(-beta * (u - 1/2)), u = (j + 1/2) / B. beta = 0 is uniform masking; beta > 0 masks
the end of a block more than its start, most strongly at low noise (t -> 1 masks everything either
way). This is our parametrisation of the paper's half-life schedule; the 1/p weight keeps the loss
an ELBO for any beta.
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

    def select(self, rows: torch.Tensor) -> "NoisedBatch":
        """The given rows (a process's share of a batch whose masks were drawn for every row)."""
        return NoisedBatch(*(getattr(self, f.name)[rows] for f in fields(self)))


def _rand(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform draws from the generator's own device (the seeded stream does not depend on where
    the model runs), moved to ``device``."""
    gen_device = generator.device if generator is not None else "cpu"
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def collate(rows: list[tuple[list[int], int]], pad_id: int):
    """Right-pad to the longest row: (ids, valid, prompt_lens)."""
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros_like(ids)
    for i, (r, _) in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        valid[i, :len(r)] = 1
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
    return t.pow(torch.exp(-beta * (u - 0.5)))


def noise(clean: torch.Tensor, valid: torch.Tensor, prompt_lens: torch.Tensor, conv: Conventions, *,
          beta: float = 0.0, eps: float = 1e-3, generator: torch.Generator | None = None,
          complement_of: NoisedBatch | None = None) -> NoisedBatch:
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


def forward_aligned(model, batch: NoisedBatch, conv: Conventions, output_hidden_states: bool = False):
    """Run the model in its attention mode on the noisy batch; return (logits, outputs) where
    ``logits[:, i]`` is the prediction for token i under the shift convention.

    Block attention uses the 2L layout (clean copy + noisy copy). With shift, the first token of a
    block is predicted from the clean copy's last token of the previous block, which is what the
    cached sampler sees at inference.
    """
    dtype = next(model.parameters()).dtype
    T = batch.clean.shape[1]
    if conv.attention == "block":
        ids, pos, mask = two_copy_inputs(batch.clean, batch.noisy, batch.valid, batch.prompt_lens, conv.block_size, dtype,
                                         flex=uses_flex(model))
        out = model(input_ids=ids, position_ids=pos, attention_mask=mask, output_hidden_states=output_hidden_states)
        clean_logits, logits = out.logits[:, :T], out.logits[:, T:]
        if conv.shift:
            blocks = block_ids(batch.valid, batch.prompt_lens, conv.block_size)
            same = torch.zeros_like(batch.valid, dtype=torch.bool)
            same[:, 1:] = blocks[:, 1:] == blocks[:, :-1]
            prev_noisy = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            prev_clean = torch.cat([clean_logits[:, :1], clean_logits[:, :-1]], 1)
            logits = torch.where(same[..., None], prev_noisy, prev_clean)
        return logits, out
    if conv.attention != "bidirectional":
        raise ValueError(f"a diffusion forward needs bidirectional or block attention, not {conv.attention!r}")
    mask = attention_mask("bidirectional", batch.valid, dtype, flex=uses_flex(model))
    out = model(input_ids=batch.noisy, position_ids=position_ids(batch.valid), attention_mask=mask,
                output_hidden_states=output_hidden_states)
    logits = out.logits
    if conv.shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
    return logits, out


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (B, T) in fp32."""
    return torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


def diffusion_loss(logits: torch.Tensor, batch: NoisedBatch, weighted: bool = True,
                   eligible: torch.Tensor | None = None) -> torch.Tensor:
    """Masked cross-entropy, weighted by 1/p (or unweighted), over the number of eligible tokens
    (``eligible``: of the whole batch, when ``batch`` is one process's share of it)."""
    w = batch.weight if weighted else batch.masked.float()
    nll = token_nll(logits, batch.clean)
    return (nll * w).sum() / (batch.eligible.sum() if eligible is None else eligible).clamp(min=1)
