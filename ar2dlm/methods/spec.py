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

The objective and an added term's loss are named by import path (``"module:attribute"``, or the
object itself), imported only when a training step is built (:func:`load`): reading a config,
checking it and planning its jobs imports no torch. The planner's hooks take plain numbers and the
planner's own objects (``Shape``, ``Launch``, ``Sizing`` of :mod:`ar2dlm.plan.memory`), read by
attribute, so this package does not import the planner.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

TEACHER_READS = (None, "decoder", "head")  # nothing; hidden states (the decoder alone is loaded); logits too


def load(ref: str | Any) -> Any:
    """The object an import path ``"package.module:attribute"`` names (an object is itself)."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{ref!r} is not an import path of the form 'package.module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{ref!r} names nothing importable: {exc}") from exc


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
    on when it can exceed ``training.seq_len`` (an on-policy rollout after its prompt); None: it cannot.
    ``teacher``: what the part reads of the frozen teacher (``TEACHER_READS``): an added term's loss,
    or the objective a method or term brings (the objective class says the same, checked when it
    is built)."""

    defaults: dict = field(default_factory=dict)
    description: str = ""
    checks: Callable[[dict, dict], Iterable[tuple[str, str]]] = _no_problems
    memory: Callable[[Any], dict[str, float]] = _no_memory
    flops: Callable[[Any, dict, bool], float] = _no_flops
    decode_seconds: Callable[[Any, dict, Any, dict], float] = _no_decoding
    training_data: Callable[[dict, dict], tuple[str, str]] | None = None
    positions: Callable[[dict], int] | None = None
    teacher: str | None = None

    def __post_init__(self):
        if self.teacher not in TEACHER_READS:
            raise ValueError(f"{self}: teacher must be one of {TEACHER_READS}, not {self.teacher!r}")


@dataclass(frozen=True, kw_only=True)
class Method(Part):
    """A method: its name (``runs.<name>.method``), its objective (an
    :class:`~ar2dlm.training.objective.Objective` class or its import path, constructed as
    ``objective(run, conv, seed, added_terms)`` when it takes added loss terms (``takes_terms``: a
    ``ComposedObjective``), else ``objective(run, conv, seed)``), the loss terms it cannot go without,
    and whether a conversion run of the config may name it (DPO trains on preference pairs; AR-MAP
    runs it)."""

    name: str
    objective: str | type
    takes_terms: bool = True
    requires: tuple[str, ...] = ()
    conversion: bool = True

    def __str__(self) -> str:
        return f"method {self.name!r}"


@dataclass(frozen=True, kw_only=True)
class Term(Part):
    """A loss term under config key ``key``: ``noun`` names it in errors ("an alignment term"),
    ``schema`` is the JSON schema of its options (the config schema's ``runs.*.<key>``), and exactly
    one of ``loss`` (an added term: ``loss(run, conv, outputs: StepOutputs)``, a scalar normalised
    by whole-micro-batch counts, logged under ``key``) and ``objective`` (a ``ComposedObjective``
    class the term brings), each the object or its import path. ``active(run)``: whether a run that
    names the term computes it (alignment with lambda 0 does not); ``student_hidden``: whether it
    reads the student's hidden states."""

    key: str
    noun: str
    schema: dict
    loss: str | Callable | None = None
    objective: str | type | None = None
    active: Callable[[dict], bool] = lambda run: True
    student_hidden: bool = False
    takes_terms = True  # the objective a term brings is a ComposedObjective

    def __post_init__(self):
        super().__post_init__()
        if (self.loss is None) == (self.objective is None):
            raise ValueError(
                f"loss term {self.key!r} needs exactly one of loss (a term added to the run's objective) "
                "and objective (the objective it brings)"
            )

    def __str__(self) -> str:
        return f"loss term {self.key!r}"


def teacher_reads(reads: Iterable[str | None]) -> tuple[bool, bool]:
    """(needs a teacher, needs its head) of what an objective and its added terms read of it."""
    reads = list(reads)
    return any(r is not None for r in reads), "head" in reads
