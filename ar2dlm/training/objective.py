"""The interface between the training loop and a method: :class:`Objective`. The trainer asks it
whether a frozen teacher is needed, which corpus documents are trained on, the loss terms of a
micro-batch and the tokens a step trains on; it never branches on a method or a loss term's name.
The methods declare themselves in :mod:`ar2dlm.methods`, one module each; their objectives live in
:mod:`ar2dlm.training.objectives`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from typing import Any, NamedTuple

import torch

from ..core.attention import position_ids
from ..core.conventions import Conventions
from ..core.diffusion import NoisedBatch
from ..methods.spec import Term, load, teacher_reads
from .data import MicroBatch


@torch.no_grad()
def teacher_forward(teacher, ids: torch.Tensor, valid: torch.Tensor, hidden: bool = False):
    """The frozen AR teacher, causal, on clean tokens (right padding, explicit positions)."""
    return teacher(input_ids=ids, attention_mask=valid, position_ids=position_ids(valid), output_hidden_states=hidden)


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
        self.sizes = {
            "params": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "teacher": sum(p.numel() for p in teacher.parameters()) if teacher is not None else 0,
        }

    def _count(self, student_tokens, teacher_tokens=0, rollout_tokens=0) -> None:
        """This process's FLOPs of the micro-batch ``terms`` just computed (``last_flops``), counted
        per parameter and position (attention's quadratic term and the positions a loss does not
        project to the vocabulary are not separated): the student's forward and backward, 2N + 2N
        for activation gradients + 2N_trainable for weight gradients per position it ran over (the
        2L layout's clean and noisy copies both); the frozen teacher's forward, 2N_teacher per
        position; an on-policy rollout's forward passes, 2N per position they ran over."""
        n = self.sizes
        block = 2 if self.conv.attention == "block" else 1
        self.last_flops = {
            "student": float((4 * n["params"] + 2 * n["trainable"]) * block * int(student_tokens)),
            "teacher": float(2 * n["teacher"] * int(teacher_tokens)),
            "rollout": float(2 * n["params"] * int(rollout_tokens)),
        }

    def batches(self, corpus_path, tokenizer, seq_len: int, micro: int, seed: int):
        """The run's micro-batches when the objective reads its own kind of data, else None (the
        trainer's token rows)."""
        return None

    def documents(self, docs: list[dict]) -> list[dict]:
        """The corpus documents the run trains on (all, unless the objective chooses)."""
        return docs

    def terms(self, model, teacher, mb: MicroBatch, step: int, generator: torch.Generator) -> dict:
        """Named loss terms of this process's share of a micro-batch (the loss is their sum). Masks
        come from ``generator``, the same stream on every process, drawn for the whole micro-batch."""
        raise NotImplementedError

    def trained_tokens(self, mb: MicroBatch, step: int) -> int:
        """Tokens the whole micro-batch trains on."""
        return int(mb.valid.sum())


def reads(objective: type[Objective]) -> str | None:
    """What an objective class reads of the frozen teacher, in the methods' words (``TEACHER_READS``)."""
    return "head" if objective.teacher_head else "decoder" if objective.needs_teacher else None


class StepOutputs(NamedTuple):
    """What an added loss term reads of a step: this process's rows of the noised batch, the
    student's outputs on them (hidden states when a term asked for them), ``teacher()``: the frozen
    teacher's outputs on the clean tokens with hidden states (run once, on first call), and
    ``whole_count(select)``: the whole micro-batch's count of positions ``select(NoisedBatch)``
    marks, the normaliser of this process's share (None with one process)."""

    batch: NoisedBatch
    student: Any
    teacher: Callable[[], Any]
    whole_count: Callable[[Callable[[NoisedBatch], torch.Tensor]], torch.Tensor | None]


class ComposedObjective(Objective):
    """An objective that added loss terms ride on: it computes its own loss, then each added term's
    from the step's outputs (``added_terms``), each scaled like its own by the number of processes."""

    def __init__(self, run: dict, conv, seed: int, added: Iterable[Term] = ()):
        super().__init__(run, conv, seed)
        self.added = tuple(added)
        self.losses = {t.key: load(t.loss) for t in self.added}
        self.needs_teacher, self.teacher_head = teacher_reads([reads(type(self)), *(t.teacher for t in self.added)])
        self.student_hidden = any(t.student_hidden for t in self.added)
        self.teacher_hidden = any(t.teacher is not None for t in self.added)

    def added_terms(self, outputs: StepOutputs, world: int) -> dict[str, torch.Tensor]:
        outputs = outputs._replace(teacher=cache(outputs.teacher))
        return {key: loss(self.run, self.conv, outputs) * world for key, loss in self.losses.items()}
