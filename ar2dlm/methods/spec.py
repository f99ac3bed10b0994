"""What a method and a loss term declare, each in its own module (the registry,
:mod:`ar2dlm.methods.registry`, collects them): defaults, config checks, the objective or loss term
the trainer computes, what they read of the frozen teacher, and the memory and FLOPs the planner
counts for them.

A **method** (``runs.<name>.method``) gives a run its defaults over :data:`BASE` and its objective.
A **loss term** is a config key a run of any method may add (``align:``, ``distill:``); its options
are merged over the term's defaults. An added term contributes a named loss to the objective's
(``loss``); a term may instead bring the objective itself (``objective``: distillation trains on
the student's own decoding states, so it replaces the masked-diffusion loss), and terms of the
first kind ride on it.

The planner's hooks take plain numbers and the planner's own objects (``Shape``, ``Launch``,
``Sizing`` of :mod:`ar2dlm.plan.memory`), read by attribute, so this package does not import the
planner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple

import torch

from ..core.diffusion import NoisedBatch
from ..training.objective import Objective

TEACHER_READS = (None, "decoder", "head")  # nothing; hidden states (the decoder alone is loaded); logits too


def _no_problems(run: dict, config: dict) -> Iterable[tuple[str, str]]:
    return ()


def _no_memory(sizing) -> dict[str, float]:
    return {}


def _no_flops(shape, run: dict, checkpointing: bool) -> float:
    return 0.0


def _no_decoding(shape, run: dict, launch, cluster: dict) -> float:
    return 0.0


@dataclass(frozen=True, kw_only=True)
class Part:
    """What a method and a loss term both declare.

    ``checks(run, config)``: the cross-key problems of a resolved run, as (key under the run, message)
    pairs, e.g. ``("align.layers", "layer 7 does not exist ...")``; the pipeline names the full key.
    ``memory(sizing)``: bytes per GPU it adds at a step's peak, by part (``parameters``,
    ``activations``, ``teacher``, ... or ``rollout``: a phase apart from the step, see
    ``plan.memory.peak``). ``flops(shape, run, checkpointing)``: FLOPs per optimizer step beyond the
    student's forward and backward and the frozen teacher's forward, which the planner counts itself.
    ``decode_seconds(shape, run, launch, cluster)``: seconds per step that memory bandwidth bounds
    rather than FLOPs (an on-policy rollout). ``training_data(run, prompt_sets)``: of the part that
    gives a run its objective, the (source, selection) of its token rows (``layout.token_rows_dir``);
    None: the run's ``data`` cut, every document. ``positions(run)``: the longest row a step trains
    on when it can exceed ``training.seq_len`` (an on-policy rollout after its prompt); None: it cannot."""

    defaults: dict = field(default_factory=dict)
    description: str = ""
    checks: Callable[[dict, dict], Iterable[tuple[str, str]]] = _no_problems
    memory: Callable[[Any], dict[str, float]] = _no_memory
    flops: Callable[[Any, dict, bool], float] = _no_flops
    decode_seconds: Callable[[Any, dict, Any, dict], float] = _no_decoding
    training_data: Callable[[dict, dict], tuple[str, str]] | None = None
    positions: Callable[[dict], int] | None = None


@dataclass(frozen=True, kw_only=True)
class Method(Part):
    """A method: its name (``runs.<name>.method``), its objective (an :class:`Objective` class,
    constructed as ``objective(run, conv, seed, added_terms)`` when it is a :class:`ComposedObjective`,
    else ``objective(run, conv, seed)``), the loss terms it cannot go without, and whether a
    conversion run of the config may name it (DPO trains on preference pairs; AR-MAP runs it)."""

    name: str
    objective: type[Objective]
    requires: tuple[str, ...] = ()
    conversion: bool = True


@dataclass(frozen=True, kw_only=True)
class Term(Part):
    """A loss term under config key ``key``: ``noun`` names it in errors ("an alignment term"),
    ``schema`` is the JSON schema of its options (the config schema's ``runs.*.<key>``), and exactly
    one of ``loss`` (an added term: ``loss(run, conv, outputs: StepOutputs)``, a scalar normalised
    by whole-micro-batch counts, logged under ``key``) and ``objective`` (a
    :class:`ComposedObjective` class the term brings). ``active(run)``: whether a run that names
    the term computes it (alignment with lambda 0 does not). ``teacher``: what the term reads of the
    frozen teacher (``TEACHER_READS``); ``student_hidden``: whether it reads the student's hidden
    states."""

    key: str
    noun: str
    schema: dict
    loss: Callable[[dict, Any, StepOutputs], torch.Tensor] | None = None
    objective: type[Objective] | None = None
    active: Callable[[dict], bool] = lambda run: True
    teacher: str | None = None
    student_hidden: bool = False

    def __post_init__(self):
        if (self.loss is None) == (self.objective is None):
            raise ValueError(
                f"loss term {self.key!r} needs exactly one of loss (a term added to the run's objective) "
                "and objective (the objective it brings)"
            )
        if self.teacher not in TEACHER_READS:
            raise ValueError(f"loss term {self.key!r}: teacher must be one of {TEACHER_READS}, not {self.teacher!r}")


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


def teacher_reads(objective: type[Objective], added: Iterable[Term]) -> tuple[bool, bool]:
    """(needs a teacher, needs its head) of an objective class with added terms."""
    added = list(added)
    return (
        objective.needs_teacher or any(t.teacher is not None for t in added),
        objective.teacher_head or any(t.teacher == "head" for t in added),
    )


class ComposedObjective(Objective):
    """An objective that added loss terms ride on: it computes its own loss, then each added term's
    from the step's outputs (``added_terms``), each scaled like its own by the number of processes."""

    def __init__(self, run: dict, conv, seed: int, added: Iterable[Term] = ()):
        super().__init__(run, conv, seed)
        self.added = tuple(added)
        self.needs_teacher, self.teacher_head = teacher_reads(type(self), self.added)
        self.student_hidden = any(t.student_hidden for t in self.added)
        self.teacher_hidden = any(t.teacher is not None for t in self.added)

    def added_terms(self, outputs: StepOutputs, world: int) -> dict[str, torch.Tensor]:
        outputs = outputs._replace(teacher=cache(outputs.teacher))
        return {t.key: t.loss(self.run, self.conv, outputs) * world for t in self.added}
