"""REPR-ALIGN's added loss (the ``align:`` term, :mod:`ar2dlm.methods.alignment` declares it): lambda *
the mean over layers and masked positions of 1 - cos (or the mean squared difference) between the
student's hidden states and the frozen causal teacher's on the clean tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.conventions import Conventions
from ...core.diffusion import NoisedBatch
from ...methods.alignment import layer_indices
from ..objective import StepOutputs


def alignment_positions(batch: NoisedBatch, shift: bool) -> torch.Tensor:
    """Positions whose hidden states are aligned: the masked ones, or (with shift) the position
    before each masked token, which is where its prediction is read (Open-dLLM)."""
    if not shift:
        return batch.masked
    pos = torch.zeros_like(batch.masked)
    pos[:, :-1] = batch.masked[:, 1:]
    return pos


def alignment_loss(
    student_hidden,
    teacher_hidden,
    where: torch.Tensor,
    layers: list[int],
    metric: str,
    total: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over layers and selected positions of 1 - cos (or the mean squared difference);
    ``total``: the number of selected positions of the whole batch when ``where`` selects one
    process's share (the sum over processes is then the whole batch's mean)."""
    if not where.any():
        return student_hidden[0].sum() * 0.0
    terms = []
    for layer in layers:
        s, t = student_hidden[layer][where].float(), teacher_hidden[layer][where].float()
        if total is None:
            terms.append((1 - F.cosine_similarity(s, t, dim=-1)).mean() if metric == "cos" else (s - t).pow(2).mean())
        else:
            per = 1 - F.cosine_similarity(s, t, dim=-1) if metric == "cos" else (s - t).pow(2).mean(-1)
            terms.append(per.sum() / total.clamp(min=1))
    return torch.stack(terms).mean()


def align_loss(run: dict, conv: Conventions, step: StepOutputs) -> torch.Tensor:
    """lambda * alignment between the student's hidden states (the noisy copy's, under block
    attention) and the causal teacher's on the clean tokens."""
    hs = step.student.hidden_states
    if conv.attention == "block":
        hs = [h[:, step.batch.clean.shape[1] :] for h in hs]
    layers = layer_indices(run["align"]["layers"], len(hs) - 1)
    where = alignment_positions(step.batch, conv.shift)
    total = step.whole_count(lambda b: alignment_positions(b, conv.shift))
    return run["align"]["lambda"] * alignment_loss(
        hs, step.teacher().hidden_states, where, layers, run["align"]["metric"], total
    )
