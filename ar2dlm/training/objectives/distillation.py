"""OPDLM's objective (the ``distill:`` term brings it; :mod:`ar2dlm.methods.distillation` declares
it): a divergence between the frozen AR teacher's next-token distribution and the student's at
masked positions, on the student's own decoding states (on-policy) or on random masks of clean
completions (off-policy); added terms (alignment) ride on it, their teacher hidden states from the
distillation's teacher forward."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...core.attention import position_ids
from ...core.conventions import Conventions
from ...core.diffusion import NoisedBatch, chunked_rows, forward_aligned, item_seed, logits_at, noise
from ...core.sampling import Decoding, Trajectory, generate_dlm
from ...data.corpus import select_documents
from ...methods.distillation import document_selection, rollout_length
from ..objective import ComposedObjective, StepOutputs
from ..sharding import gathered


def divergence(teacher_logits, student_logits, kind: str = "forward_kl", top_k: int | None = None) -> torch.Tensor:
    """Per-position divergence between teacher and student next-token distributions.

    forward_kl = KL(teacher || student) (OPDLM's default), reverse_kl = KL(student || teacher),
    jsd = Jensen-Shannon. ``top_k`` keeps the teacher's k most likely tokens (renormalised) and
    the student's log-probabilities there: the sparse KL used for large vocabularies.
    """
    t_logp = torch.log_softmax(teacher_logits.float(), -1)
    s_logp = torch.log_softmax(student_logits.float(), -1)
    if top_k is not None:
        if kind != "forward_kl":
            raise ValueError("top-k sparse distillation is defined for forward_kl only")
        top, idx = t_logp.topk(top_k, -1)
        t_sparse = torch.log_softmax(top, -1)
        return (t_sparse.exp() * (t_sparse - s_logp.gather(-1, idx))).sum(-1)
    if kind == "forward_kl":
        return (t_logp.exp() * (t_logp - s_logp)).sum(-1)
    if kind == "reverse_kl":
        return (s_logp.exp() * (s_logp - t_logp)).sum(-1)
    if kind == "jsd":
        m = torch.logsumexp(torch.stack([t_logp, s_logp]), 0) - math.log(2)
        return 0.5 * ((t_logp.exp() * (t_logp - m)).sum(-1) + (s_logp.exp() * (s_logp - m)).sum(-1))
    raise ValueError(f"unknown divergence {kind!r} (known: forward_kl, reverse_kl, jsd)")


@torch.no_grad()
def teacher_targets(teacher, batch: NoisedBatch, where: torch.Tensor, hidden: bool = False):
    """The teacher's distribution for each token i of ``where`` given x0_<i: its causal logits at
    i - 1, projected at those positions only. Returns (logits (N, V) in ``where``'s row-major
    order, outputs)."""
    idx = torch.arange(batch.clean.shape[1], device=where.device).expand_as(where)
    return logits_at(
        teacher,
        where,
        (idx - 1).clamp(min=0),
        batch.clean.shape[1],
        input_ids=batch.clean,
        attention_mask=batch.valid,
        position_ids=position_ids(batch.valid),
        output_hidden_states=hidden,
    )


def rollout_decoding(distill: dict, length: int, conv: Conventions) -> Decoding:
    """How an on-policy rollout decodes: the run's threshold and sampling temperature, whole
    rollouts (no stop at end-of-text), the block cache where the attention is blockwise."""
    return Decoding(
        length,
        conv.block_size,
        threshold=distill["threshold"],
        use_cache=conv.attention == "block",
        temperature=distill["temperature"],
        stop_at_eos=False,
    )


def on_policy_state(
    model, conv: Conventions, prompts: list[list[int]], decoding: Decoding, row_seeds: list[int]
) -> tuple[NoisedBatch, int]:
    """Decode with the student's own sampler (row i sampled from seed ``2 * row_seeds[i]``), then
    take one partially decoded state per block from the trajectory (uniformly among the steps where
    that row still had masks, drawn from the row's own generator, seeded ``2 * row_seeds[i] + 1``:
    ``block_size`` draws per block, one per possible step, so a row's pick does not depend on the
    other rows). The clean tokens are the trajectory's own final output x0. The loss positions are
    the masked ones before the row's first end-of-text, which is excluded as in divelab/OPDLM: past
    it the teacher would be conditioned on what a stopped rollout never writes. Returns the state and
    the tokens the rollout's forwards read."""
    traj = Trajectory()
    was_training = model.training
    with gathered(model):  # a sharded student decodes its own prompts without collectives
        generate_dlm(model, conv, prompts, decoding, row_seeds=[r * 2 for r in row_seeds], trajectory=traj)
    model.train(was_training)
    generators = [torch.Generator().manual_seed(r * 2 + 1) for r in row_seeds]
    x0, noisy = traj.canvas, traj.canvas.clone()
    by_block: dict[int, list[torch.Tensor]] = {}
    for start, state in traj.states:
        by_block.setdefault(start, []).append(state)
    for start, states in by_block.items():
        stack = torch.stack(states, 1)  # (B, steps, block)
        has_mask = (stack == conv.mask_token_id).any(-1)  # (B, steps)
        draw = torch.stack([torch.rand(conv.block_size, generator=g) for g in generators])[:, : stack.shape[1]]
        pick = (draw.to(stack.device) * has_mask).argmax(1)
        noisy[:, start : start + conv.block_size] = stack[torch.arange(len(pick), device=stack.device), pick]
    response = traj.valid.bool() & (position_ids(traj.valid) >= traj.prompt_lens.view(-1, 1))
    ended = (response & (x0 == conv.eos_token_id)).long().cummax(1).values.bool()  # the first end-of-text onwards
    elig = response & ~ended
    masked = (noisy == conv.mask_token_id) & elig
    zeros = torch.zeros(x0.shape, dtype=torch.float32, device=x0.device)
    return NoisedBatch(x0, noisy, masked, zeros, elig, traj.valid, traj.prompt_lens, zeros), traj.forward_tokens


def whole_batch_count(local: torch.Tensor, world: int) -> torch.Tensor | None:
    """A count summed over the processes (None with one process: the local count is the whole)."""
    if world == 1:
        return None
    total = local.sum().detach().clone()
    torch.distributed.all_reduce(total)
    return total


class Distillation(ComposedObjective):
    """KL(teacher || student) (or the run's divergence) on masked positions, with the teacher run
    causally on x0. On-policy, x0 and the noisy states come from the student's own decoding of this
    process's prompts; off-policy, x0 is the clean batch cut to the rollout length and the states
    are random masks."""

    needs_teacher = True
    teacher_head = True
    rollout_state = staticmethod(on_policy_state)  # the on-policy state's source (a memory trace stands in for it)

    def documents(self, docs: list[dict]) -> list[dict]:
        return select_documents(docs, document_selection(self.run))

    def terms(self, model, teacher, mb, step, generator) -> dict:
        conv, d = self.conv, self.run["distill"]
        length = rollout_length(d, step, conv.block_size)
        if d["on_policy"]:
            ids, _, plens = mb.local()
            prompts = [ids[i, : int(plens[i])].tolist() for i in range(len(ids))]
            # per row, from its run-wide sample index (the tokens it samples and the states it keeps)
            row_seeds = [item_seed(self.seed, i) for i in mb.sample_ids()]
            batch, rollout_tokens = self.rollout_state(
                model, conv, prompts, rollout_decoding(d, length, conv), row_seeds
            )
            masked = whole_batch_count(batch.masked, mb.world)

            def whole_count(select):
                return whole_batch_count(select(batch), mb.world)
        else:
            keep = (position_ids(mb.valid) < mb.prompt_lens.view(-1, 1) + length) & mb.valid.bool()
            width = int(keep.sum(1).max())
            whole = noise(
                mb.ids[:, :width], (mb.valid.bool() & keep)[:, :width].long(), mb.prompt_lens, conv, generator=generator
            )
            batch = mb.share(whole)
            masked = mb.whole_count(whole.masked)

            def whole_count(select):
                return mb.whole_count(select(whole))

        where = batch.masked
        logits, out = forward_aligned(model, batch, conv, output_hidden_states=self.student_hidden, where=where)
        targets, t_out = teacher_targets(teacher, batch, where, hidden=self.teacher_hidden)
        kl = chunked_rows(partial(divergence, kind=d["divergence"], top_k=d["top_k"]), targets, logits)
        if not where.any():
            distill = logits.sum() * 0.0
        else:
            distill = kl.mean() if masked is None else kl.sum() / masked.clamp(min=1)
        terms = {"distill": distill * mb.world}
        terms |= self.added_terms(StepOutputs(batch, out, lambda: t_out, whole_count), mb.world)
        tokens = batch.valid.sum()
        self._count(tokens, tokens, rollout_tokens if d["on_policy"] else 0)
        return terms

    def trained_tokens(self, mb, step) -> int:
        """The prompts plus the rollout length (on-policy), or the batch cut to it (off-policy)."""
        length = rollout_length(self.run["distill"], step, self.conv.block_size)
        if self.run["distill"]["on_policy"]:
            return int(mb.prompt_lens.sum()) + len(mb.prompt_lens) * length
        return int(((position_ids(mb.valid) < mb.prompt_lens.view(-1, 1) + length) & mb.valid.bool()).sum())
