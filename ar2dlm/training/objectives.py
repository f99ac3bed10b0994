"""Training objectives that methods compose: masked diffusion (MDLM / Efficient-DLM), REPR-ALIGN's
representation alignment to a frozen causal teacher, and OPDLM's distillation from a frozen AR
teacher on the student's own decoding trajectories. A run's loss is the sum of its terms.

The trainer sees one interface, :class:`Objective` (``objective_for(run, conv, seed)``): whether a
frozen teacher is needed, which corpus documents are trained on, the loss terms of a micro-batch
and the tokens a step trains on. It never branches on a method or objective name."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from ..core.attention import position_ids
from ..core.conventions import Conventions
from ..core.diffusion import (NoisedBatch, chunked_rows, diffusion_loss, forward_aligned, logits_at, noise,
                              selected_nll)
from ..data.corpus import document_selection, select_documents
from .data import MicroBatch
from .sharding import gathered

FREEZE_GROUPS = {  # Qwen3 parameter-name patterns of each module group
    "embeddings": ("model.embed_tokens.",),
    "lm_head": ("lm_head.",),
    "mlp": (".mlp.",),
    "attention": (".self_attn.",),
    "norms": ("layernorm.", "model.norm.", "_norm."),
}


def freeze(model, groups: list[str]) -> list[str]:
    """Set requires_grad False on the named module groups; return the frozen parameter names.
    With tied embeddings, freezing either embeddings or lm_head freezes the shared matrix."""
    frozen = []
    for name, p in model.named_parameters():
        if any(pat in name or name.startswith(pat) for g in groups for pat in FREEZE_GROUPS[g]):
            p.requires_grad_(False)
            frozen.append(name)
    return frozen


def layer_indices(spec, n_layers: int) -> list[int]:
    """Hidden-state indices (0 = embedding output, n_layers = last layer) of a layer set."""
    if isinstance(spec, list):
        return spec
    third = math.ceil((n_layers + 1) / 3)
    return {"all": list(range(n_layers + 1)), "lower": list(range(0, third)),
            "middle": list(range(third, min(2 * third, n_layers + 1))),
            "upper": list(range(min(2 * third, n_layers + 1), n_layers + 1))}[spec]


def alignment_positions(batch: NoisedBatch, shift: bool) -> torch.Tensor:
    """Positions whose hidden states are aligned: the masked ones, or (with shift) the position
    before each masked token, which is where its prediction is read (Open-dLLM)."""
    if not shift:
        return batch.masked
    pos = torch.zeros_like(batch.masked)
    pos[:, :-1] = batch.masked[:, 1:]
    return pos


def alignment_loss(student_hidden, teacher_hidden, where: torch.Tensor, layers: list[int], metric: str,
                   total: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over layers and selected positions of 1 - cos (or the mean squared difference);
    ``total``: the number of selected positions of the whole batch when ``where`` selects one
    process's share (the sum over processes is then the whole batch's mean)."""
    if not where.any():
        return student_hidden[0].sum() * 0.0
    terms = []
    for l in layers:
        s, t = student_hidden[l][where].float(), teacher_hidden[l][where].float()
        if total is None:
            terms.append((1 - F.cosine_similarity(s, t, dim=-1)).mean() if metric == "cos" else (s - t).pow(2).mean())
        else:
            per = 1 - F.cosine_similarity(s, t, dim=-1) if metric == "cos" else (s - t).pow(2).mean(-1)
            terms.append(per.sum() / total.clamp(min=1))
    return torch.stack(terms).mean()


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
def teacher_forward(teacher, ids: torch.Tensor, valid: torch.Tensor, hidden: bool = False):
    """The frozen AR teacher, causal, on clean tokens (right padding, explicit positions)."""
    return teacher(input_ids=ids, attention_mask=valid, position_ids=position_ids(valid), output_hidden_states=hidden)


@torch.no_grad()
def teacher_targets(teacher, batch: NoisedBatch, where: torch.Tensor, hidden: bool = False):
    """The teacher's distribution for each token i of ``where`` given x0_<i: its causal logits at
    i - 1, projected at those positions only. Returns (logits (N, V) in ``where``'s row-major
    order, outputs)."""
    idx = torch.arange(batch.clean.shape[1], device=where.device).expand_as(where)
    return logits_at(teacher, where, (idx - 1).clamp(min=0), batch.clean.shape[1], input_ids=batch.clean,
                     attention_mask=batch.valid, position_ids=position_ids(batch.valid), output_hidden_states=hidden)


def wants_alignment(run: dict) -> bool:
    return run["align"] is not None and run["align"]["lambda"] > 0


def align_term(run: dict, conv: Conventions, student_out, batch: NoisedBatch, teacher_out,
               total: torch.Tensor | None = None) -> torch.Tensor:
    """lambda * alignment between the student's hidden states (the noisy copy's, under block
    attention) and the causal teacher's on the clean tokens (``total``: see ``alignment_loss``)."""
    hs = student_out.hidden_states
    if conv.attention == "block":
        hs = [h[:, batch.clean.shape[1]:] for h in hs]
    layers = layer_indices(run["align"]["layers"], len(hs) - 1)
    where = alignment_positions(batch, conv.shift)
    return run["align"]["lambda"] * alignment_loss(hs, teacher_out.hidden_states, where, layers, run["align"]["metric"],
                                                   total)


def rollout_length(distill: dict, step: int, block_size: int) -> int:
    """Fixed length, or the cosine curriculum from min_length to max_length over warmup_steps,
    rounded down to whole blocks."""
    c = distill["curriculum"]
    if not c:
        return distill["rollout_length"]
    frac = 0.5 * (1 - math.cos(math.pi * min(1.0, step / c["warmup_steps"])))
    length = c["min_length"] + frac * (c["max_length"] - c["min_length"])
    return max(block_size, int(length) // block_size * block_size)


def on_policy_state(model, conv: Conventions, prompts: list[list[int]], length: int, threshold: float,
                    generators: list[torch.Generator], seed: int, counts: dict | None = None) -> NoisedBatch:
    """Decode with the student's own sampler, then take one partially decoded state per block from
    the trajectory (uniformly among the steps where that row still had masks, drawn from the row's
    own generator: ``block_size`` draws per block, one per possible step, so a row's pick does not
    depend on the other rows). The clean tokens are the trajectory's own final output x0."""
    from ..core.sampling import Trajectory, generate_dlm

    traj = Trajectory()
    was_training = model.training
    with gathered(model):  # a sharded student decodes its own prompts without collectives
        generate_dlm(model, conv, prompts, length, conv.block_size, threshold=threshold,
                     use_cache=conv.attention == "block", seed=seed, stop_at_eos=False, trajectory=traj)
    model.train(was_training)
    if counts is not None:
        counts["forward_tokens"] = traj.forward_tokens
    x0, noisy = traj.canvas, traj.canvas.clone()
    by_block: dict[int, list[torch.Tensor]] = {}
    for start, state in traj.states:
        by_block.setdefault(start, []).append(state)
    for start, states in by_block.items():
        stack = torch.stack(states, 1)  # (B, steps, block)
        has_mask = (stack == conv.mask_token_id).any(-1)  # (B, steps)
        draw = torch.stack([torch.rand(conv.block_size, generator=g) for g in generators])[:, :stack.shape[1]]
        pick = (draw.to(stack.device) * has_mask).argmax(1)
        noisy[:, start:start + conv.block_size] = stack[torch.arange(len(pick), device=stack.device), pick]
    masked = noisy == conv.mask_token_id
    zeros = torch.zeros(x0.shape, dtype=torch.float32, device=x0.device)
    elig = traj.valid.bool() & (position_ids(traj.valid) >= traj.prompt_lens.view(-1, 1))
    return NoisedBatch(x0, noisy, masked, zeros, elig, traj.valid, traj.prompt_lens, zeros)


def _whole_batch_count(local: torch.Tensor, world: int) -> torch.Tensor | None:
    """A count summed over the processes (None with one process: the local count is the whole)."""
    if world == 1:
        return None
    total = local.sum().detach().clone()
    torch.distributed.all_reduce(total)
    return total


class Objective:
    """A run's training objective, as the trainer uses it. Loss terms are normalised by counts of
    the whole micro-batch and scaled by the number of processes, so the gradient the processes
    average is the whole micro-batch's, whatever their number."""

    needs_teacher = False
    teacher_head = False  # whether the teacher's logits are used (else its decoder only is loaded)

    def __init__(self, run: dict, conv: Conventions, seed: int):
        self.run, self.conv, self.seed = run, conv, seed
        self.sizes = {"params": 0, "trainable": 0, "teacher": 0}
        self.last_flops: dict[str, float] = {}

    def count_parameters(self, model, teacher) -> None:
        """The parameter counts the FLOP count uses (call before sharding)."""
        self.sizes = {"params": sum(p.numel() for p in model.parameters()),
                      "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                      "teacher": sum(p.numel() for p in teacher.parameters()) if teacher is not None else 0}

    def _count(self, student_tokens, teacher_tokens=0, rollout_tokens=0) -> None:
        """This process's FLOPs of the micro-batch ``terms`` just computed (``last_flops``), counted
        per parameter and position (attention's quadratic term and the positions a loss does not
        project to the vocabulary are not separated): the student's forward and backward, 2N + 2N
        for activation gradients + 2N_trainable for weight gradients per position it ran over (the
        2L layout's clean and noisy copies both); the frozen teacher's forward, 2N_teacher per
        position; an on-policy rollout's forward passes, 2N per position they ran over."""
        n = self.sizes
        block = 2 if self.conv.attention == "block" else 1
        self.last_flops = {"student": float((4 * n["params"] + 2 * n["trainable"]) * block * int(student_tokens)),
                           "teacher": float(2 * n["teacher"] * int(teacher_tokens)),
                           "rollout": float(2 * n["params"] * int(rollout_tokens))}

    def batches(self, corpus_path, tokenizer, seq_len: int, micro: int, seed: int):
        """The run's micro-batches when the objective reads its own kind of data, else None (the
        trainer's token rows)."""
        return None

    def documents(self, docs: list[dict]) -> list[dict]:
        """The corpus documents the run trains on: all, or the prompts of the synthetic corpus's
        sources (``all``, ``code``, ``math``) a distillation run names (a prompt set's file as is)."""
        return select_documents(docs, document_selection(self.run))

    def terms(self, model, teacher, mb: MicroBatch, step: int, generator: torch.Generator) -> dict:
        """Named loss terms of this process's share of a micro-batch (the loss is their sum). Masks
        come from ``generator``, the same stream on every process, drawn for the whole micro-batch."""
        raise NotImplementedError

    def trained_tokens(self, mb: MicroBatch, step: int) -> int:
        """Tokens the whole micro-batch trains on."""
        return int(mb.valid.sum())


class Diffusion(Objective):
    """Masked-diffusion cross-entropy (MDLM, Efficient-DLM), plus REPR-ALIGN's term when lambda > 0."""

    def __init__(self, run: dict, conv: Conventions, seed: int):
        super().__init__(run, conv, seed)
        self.needs_teacher = wants_alignment(run)

    def terms(self, model, teacher, mb, step, generator) -> dict:
        run, conv = self.run, self.conv
        beta = run["positional_beta"] if run["masking"] == "positional" else 0.0
        whole = noise(mb.ids, mb.valid, mb.prompt_lens, conv, beta=beta, generator=generator)
        batch = mb.share(whole)
        logits, out = forward_aligned(model, batch, conv, output_hidden_states=self.needs_teacher, where=batch.masked)
        terms = {"diffusion": diffusion_loss(logits, batch, weighted=run["loss_weight"] == "inverse_t",
                                             eligible=mb.whole_count(whole.eligible)) * mb.world}
        if self.needs_teacher:
            ids, valid, _ = mb.local()
            terms["align"] = align_term(run, conv, out, batch, teacher_forward(teacher, ids, valid, hidden=True),
                                        mb.whole_count(alignment_positions(whole, conv.shift))) * mb.world
        tokens = batch.valid.sum()
        self._count(tokens, tokens if self.needs_teacher else 0)
        return terms


class Distillation(Objective):
    """OPDLM: KL(teacher || student) on masked positions, with the teacher run causally on x0.

    On-policy, x0 and the noisy states come from the student's own decoding of this process's
    prompts; off-policy, x0 is the clean batch cut to the rollout length and the states are random
    masks. REPR-ALIGN's term is added when the run has one with lambda > 0.
    """

    needs_teacher = True
    teacher_head = True


    def terms(self, model, teacher, mb, step, generator) -> dict:
        run, conv, d = self.run, self.conv, self.run["distill"]
        length = rollout_length(d, step, conv.block_size)
        align = wants_alignment(run)
        if d["on_policy"]:
            ids, _, plens = mb.local()
            prompts = [ids[i, :int(plens[i])].tolist() for i in range(len(ids))]
            picks = [torch.Generator().manual_seed((self.seed * 1_000_003 + i) * 2 + 1) for i in mb.sample_ids()]
            counts = {}
            batch = on_policy_state(model, conv, prompts, length, d["threshold"], picks,
                                    seed=self.seed * 1_000_003 + step, counts=counts)
            masked = _whole_batch_count(batch.masked, mb.world)
            positions = _whole_batch_count(alignment_positions(batch, conv.shift), mb.world) if align else None
        else:
            keep = (position_ids(mb.valid) < mb.prompt_lens.view(-1, 1) + length) & mb.valid.bool()
            width = int(keep.sum(1).max())
            whole = noise(mb.ids[:, :width], (mb.valid.bool() & keep)[:, :width].long(), mb.prompt_lens, conv,
                          generator=generator)
            batch = mb.share(whole)
            masked = mb.whole_count(whole.masked)
            positions = mb.whole_count(alignment_positions(whole, conv.shift)) if align else None
        where = batch.masked
        logits, out = forward_aligned(model, batch, conv, output_hidden_states=align, where=where)
        targets, t_out = teacher_targets(teacher, batch, where, hidden=align)
        kl = chunked_rows(partial(divergence, kind=d["divergence"], top_k=d["top_k"]), targets, logits)
        if not where.any():
            distill = logits.sum() * 0.0
        else:
            distill = kl.mean() if masked is None else kl.sum() / masked.clamp(min=1)
        terms = {"distill": distill * mb.world}
        if align:
            terms["align"] = align_term(run, conv, out, batch, t_out, positions) * mb.world
        tokens = batch.valid.sum()
        self._count(tokens, tokens, counts["forward_tokens"] if d["on_policy"] else 0)
        return terms

    def trained_tokens(self, mb, step) -> int:
        """The prompts plus the rollout length (on-policy), or the batch cut to it (off-policy)."""
        length = rollout_length(self.run["distill"], step, self.conv.block_size)
        if self.run["distill"]["on_policy"]:
            return int(mb.prompt_lens.sum()) + len(mb.prompt_lens) * length
        return int(((position_ids(mb.valid) < mb.prompt_lens.view(-1, 1) + length) & mb.valid.bool()).sum())


class Preference(Objective):
    """DPO (TRL's default sigmoid loss): -log sigmoid(beta * ((log pi(y_w|x) - log ref(y_w|x)) -
    (log pi(y_l|x) - log ref(y_l|x)))), averaged over pairs, the frozen reference in the teacher
    slot (sharded with the policy when the plan says so). Sequence log-likelihoods: the sum over
    response tokens of a causal model's log-probabilities, or a DLM's ELBO with ``elbo_samples``
    mask draws per row shared by policy and reference (drawn for the whole micro-batch, so they do
    not depend on the number of processes). Full DPO sharded like a conversion: AR-MAP's full-DPO
    option on several GPUs; one process runs TRL's DPOTrainer instead (``ar2dlm.armap.dpo``)."""

    needs_teacher = True
    teacher_head = True

    def batches(self, corpus_path, tokenizer, seq_len, micro, seed):
        from ..data.tokenization import encode_pair
        from ..provenance import read_jsonl
        from .data import PairBatches

        def row(prompt, response):  # cut to seq_len from the end of the response, as TRL's max_length
            p, c = encode_pair(tokenizer, prompt, response)
            return (p + c)[:seq_len], min(len(p), seq_len - 1)

        pairs = [(row(r["prompt"], r["chosen"]), row(r["prompt"], r["rejected"])) for r in read_jsonl(corpus_path)]
        return PairBatches(pairs, micro, seed, tokenizer.pad_token_id)

    def _logps(self, model, ids, valid, plens, noised) -> torch.Tensor:
        """Sequence log-likelihood of each row's response (ELBO for a DLM, averaged over ``noised``)."""
        if not self.conv.is_diffusion:
            idx = position_ids(valid)
            where = (idx >= plens.view(-1, 1)) & valid.bool()
            logits, _ = logits_at(model, where, (torch.arange(ids.shape[1], device=ids.device).expand_as(where) - 1).clamp(min=0),
                                  ids.shape[1], input_ids=ids, attention_mask=valid, position_ids=idx)
            per = -selected_nll(logits, ids[where])
            return torch.zeros(len(ids), device=ids.device, dtype=per.dtype).index_add(0, where.nonzero()[:, 0], per)
        total = 0.0
        for nb in noised:
            logits, _ = forward_aligned(model, nb, self.conv, where=nb.masked)
            per = -selected_nll(logits, nb.clean[nb.masked]) * nb.weight[nb.masked]
            total = total + torch.zeros(len(ids), device=ids.device, dtype=per.dtype).index_add(0, nb.masked.nonzero()[:, 0], per)
        return total / len(noised)

    def terms(self, model, reference, mb, step, generator) -> dict:
        pairs = len(mb.ids) // 2
        chosen = mb.rows[mb.rows < pairs]
        if not torch.equal(mb.rows[mb.rows >= pairs], chosen + pairs):
            raise ValueError(f"a micro-batch of {pairs} pairs must divide among {mb.world} processes")
        rows = torch.cat([chosen, chosen + pairs])
        noised = [noise(mb.ids, mb.valid, mb.prompt_lens, self.conv, generator=generator).select(rows)
                  for _ in range(self.run["preference"]["elbo_samples"])] if self.conv.is_diffusion else []
        ids, valid, plens = mb.ids[rows], mb.valid[rows], mb.prompt_lens[rows]
        policy = self._logps(model, ids, valid, plens, noised)
        with torch.no_grad():
            ref = self._logps(reference, ids, valid, plens, noised)
        passes = max(1, len(noised)) * valid.sum()
        block = 2 if self.conv.attention == "block" else 1
        self._count(passes, passes * block)  # the reference: the teacher slot's forward on the same layout
        n = len(chosen)
        margin = self.run["preference"]["beta"] * ((policy[:n] - ref[:n]) - (policy[n:] - ref[n:]))
        return {"dpo": -F.logsigmoid(margin.float()).sum() / pairs * mb.world}


def objective_for(run: dict, conv: Conventions, seed: int) -> Objective:
    """The objective a run's settings compose: DPO on preference pairs, distillation when it has a
    distill term, else diffusion."""
    if run.get("preference"):
        return Preference(run, conv, seed)
    return Distillation(run, conv, seed) if run["distill"] is not None else Diffusion(run, conv, seed)
