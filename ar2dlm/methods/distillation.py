"""OPDLM's loss term (``distill:``): a divergence between the frozen AR teacher's next-token
distribution and the student's at masked positions, on the student's own decoding states
(on-policy) or on random masks of clean completions (off-policy). It brings its own objective
(:class:`Distillation`), which replaces masked diffusion; added terms (alignment) ride on it, their
teacher hidden states from the distillation's teacher forward."""

from __future__ import annotations

import math
from functools import partial

import torch

from ..core.attention import position_ids
from ..core.conventions import Conventions, block_misfit
from ..core.diffusion import NoisedBatch, chunked_rows, forward_aligned, item_seed, logits_at, noise
from ..core.sampling import Decoding, Trajectory, generate_dlm
from ..data.corpus import PROMPT_SOURCES, select_documents
from ..training.sharding import gathered
from .spec import ComposedObjective, StepOutputs, Term

# divelab/OPDLM's public code: forward KL, threshold 0.9, on-policy, rollouts sampled at temperature 1
# (configs/rl_bd3lm.yaml: temperature 1.0, top_p 1.0, top_k 0), the loss on the masked positions before
# the rollout's first end-of-text.
DISTILL_DEFAULTS = {
    "on_policy": True,
    "divergence": "forward_kl",
    "top_k": None,
    "threshold": 0.9,
    "temperature": 1.0,
    "prompts": "all",
    "curriculum": None,
    "rollout_length": None,
}

SCHEMA = {
    "description": "OPDLM term, KL between the frozen AR teacher and the student on masked positions",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "on_policy": {
            "type": "boolean",
            "description": "true: the student's own trajectories; false: random masks of clean data",
        },
        "divergence": {"enum": ["forward_kl", "reverse_kl", "jsd"]},
        "top_k": {"type": ["integer", "null"], "minimum": 1},
        "threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "temperature": {
            "type": "number",
            "minimum": 0,
            "description": "the on-policy rollouts' sampling temperature (0: greedy)",
        },
        "prompts": {
            "type": "string",
            "description": "all, code or math (the synthetic corpus), or a key of data.prompt_sets",
        },
        "curriculum": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["min_length", "max_length", "warmup_steps"],
                    "properties": {
                        "min_length": {"type": "integer", "minimum": 1},
                        "max_length": {"type": "integer", "minimum": 1},
                        "warmup_steps": {"type": "integer", "minimum": 1},
                    },
                },
            ]
        },
        "rollout_length": {"type": "integer", "minimum": 1},
    },
}


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


def rollout_length(distill: dict, step: int, block_size: int) -> int:
    """Fixed length, or the cosine curriculum from min_length to max_length over warmup_steps,
    rounded down to whole blocks."""
    c = distill["curriculum"]
    if not c:
        return distill["rollout_length"]
    frac = 0.5 * (1 - math.cos(math.pi * min(1.0, step / c["warmup_steps"])))
    length = c["min_length"] + frac * (c["max_length"] - c["min_length"])
    return max(block_size, int(length) // block_size * block_size)


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


def document_selection(run: dict) -> str:
    """Which documents of its corpus the run trains on: the prompts of a synthetic-corpus source
    (``prompts_<name>``, PROMPT_SOURCES), or ``documents`` (a prompt set's file as is)."""
    prompts = run["distill"]["prompts"]
    return f"prompts_{prompts}" if prompts in PROMPT_SOURCES else "documents"


def training_data(run: dict, prompt_sets: dict) -> tuple[str, str]:
    """A prompt set's file, or the run's corpus cut with the prompts of a source of it."""
    prompts = run["distill"]["prompts"]
    return (f"promptset_{prompts}", "documents") if prompts in prompt_sets else (run["data"], document_selection(run))


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


def problems(run: dict, config: dict):
    """Prompts that exist for the corpus, clean completions off-policy, a rollout length that whole
    blocks make up (the pipeline names the first problem)."""
    key, d, sets = "distill", run["distill"], config["data"]["prompt_sets"]
    if d["prompts"] in PROMPT_SOURCES:
        if config["data"]["corpus"]["source"] != "synthetic":
            yield (
                f"{key}.prompts",
                (
                    f"{d['prompts']!r} selects prompts of the synthetic corpus; with a hub corpus "
                    "name a key of data.prompt_sets"
                ),
            )
    elif d["prompts"] not in sets:
        yield (
            f"{key}.prompts",
            (
                f"{d['prompts']!r} is neither all, code, math nor a key of data.prompt_sets "
                f"({', '.join(sets) or 'none defined'})"
            ),
        )
    elif not d["on_policy"] and not sets[d["prompts"]].get("completion_field"):
        yield (
            f"{key}.on_policy",
            (
                f"off-policy distillation needs clean completions; data.prompt_sets.{d['prompts']} "
                "has no completion_field"
            ),
        )
    lengths = [d["rollout_length"]] if d["rollout_length"] else []
    if d["curriculum"]:
        c = d["curriculum"]
        if c["min_length"] > c["max_length"]:
            yield f"{key}.curriculum.min_length", f"{c['min_length']} exceeds max_length {c['max_length']}"
        lengths += [c["min_length"], c["max_length"]]
    if not lengths:
        yield f"{key}.rollout_length", "on- and off-policy distillation need a rollout length (or a curriculum)"
    for length in lengths:
        if run["block_size"] and (problem := block_misfit(run["block_size"], length, "the rollout length")):
            yield key, problem


def longest_rollout(distill: dict, block_size: int) -> int:
    """The longest rollout of a run: its fixed length, or its curriculum's end."""
    c = distill["curriculum"]
    return distill["rollout_length"] if not c else max(block_size, c["max_length"] // block_size * block_size)


def canvas(run: dict) -> int:
    """The longest row an on-policy step trains on: a prompt (up to a row of ``seq_len`` less one
    token: ``data.token_rows.document_rows``) and the longest rollout after it. Off-policy rows are
    cut from a row of ``seq_len``."""
    d, seq_len = run["distill"], run["training"]["seq_len"]
    return seq_len - 1 + longest_rollout(d, run["block_size"]) if d["on_policy"] else seq_len


def memory(sz) -> dict[str, float]:
    """The teacher's logits at the masked positions; on-policy over several GPUs, the student
    gathered whole to decode its rollouts, with its KV cache (a phase apart from the step)."""
    out = {"teacher": sz.act * sz.masked * sz.shape.vocab}
    if sz.run["distill"]["on_policy"] and sz.launch.gpus > 1:
        out["rollout"] = sz.act * sz.shape.params + sz.shape.kv_cache_bytes(sz.seq_len * sz.launch.rows, sz.act)
    return out


# The fixed cost of one Hugging Face decoder forward on a GPU, per layer: module calls, dispatch and
# kernel launches, which a single-token decoding forward cannot hide behind its arithmetic. 0.9 ms a
# layer is 32 ms for Qwen3-8B's 36 layers, the middle of the 25-40 ms an 8B HF forward takes at
# decoding batch sizes on an H100 (eager attention, no CUDA graphs), against 4.9 ms for reading its
# weights at 3.35 TB/s. On CPU the dispatch alone measures 0.43 ms a layer plus 1.5 ms a forward
# (17 ms at 36 layers; benchmarks/forward_overhead.py, which measures the GPU figure too).
FORWARD_OVERHEAD_MS_PER_LAYER = 0.9


def decode_seconds(shape, run: dict, launch, cluster: dict) -> float:
    """An on-policy step's decoding, which memory bandwidth and per-forward overhead bound, not
    FLOPs: up to one forward per rollout token (a block of ``block_size`` tokens takes at most
    ``block_size`` steps), each reading the gathered bf16 weights and the KV cache of the rows, and
    each paying the model's fixed cost per forward (``cluster.forward_overhead_ms_per_layer``)."""
    if not run["distill"]["on_policy"]:
        return 0.0
    length = run["training"]["seq_len"]
    kv = shape.kv_cache_bytes(length * launch.rows, 2)
    overhead = shape.layers * cluster.get("forward_overhead_ms_per_layer", FORWARD_OVERHEAD_MS_PER_LAYER) / 1e3
    return length * ((2 * shape.params + kv) / (cluster["gpu_bandwidth_tb_s"] * 1e12) + overhead)


TERM = Term(
    key="distill",
    noun="a distillation term",
    defaults=DISTILL_DEFAULTS,
    schema=SCHEMA,
    objective=Distillation,
    checks=problems,
    memory=memory,
    decode_seconds=decode_seconds,
    training_data=training_data,
    positions=canvas,
    description="OPDLM: distil the frozen AR teacher into the student on its own decoding states",
)
