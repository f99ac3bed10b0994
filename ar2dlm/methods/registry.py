"""The registry of methods and loss terms, and what is derived from it: a run's settings from its
own keys, the objective it trains with, the parts (method and active terms) whose checks, memory
and FLOPs count, and the frozen teacher it reads.

A module registers its method or loss term by defining ``METHOD`` or ``TERM`` (or both;
:mod:`ar2dlm.methods.spec`), and only that way: the package's own modules are read when the registry
is imported (adding one is that module and a preset run that uses it); a module outside the package
is read when the config names it (``methods: [my_pkg.my_term]``, importable from PYTHONPATH)::

    # my_pkg/my_term.py
    from ar2dlm.methods.spec import Term
    TERM = Term(key="my_term", noun="my term", schema={...}, defaults={...}, loss="my_pkg.my_loss:my_loss")

A resolved run records the modules outside the package its method and terms come from
(``method_modules``), so a training job that receives only the run's settings imports them too."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ..data.token_rows import row_layout
from ..provenance import deep_merge
from .spec import Method, Part, Term, load, teacher_reads

# The settings every run has, whatever its method: the diffusion conventions, the data and the
# frozen module groups (a method's defaults and a run's own keys go over them).
BASE = {
    "init": "ar",
    "attention": "bidirectional",
    "block_size": None,
    "shift": True,
    "masking": "uniform",
    "positional_beta": 0.0,
    "loss_weight": "inverse_t",
    "data": "subset",
    "freeze": [],
}
RUN_KEYS = {"method", "name", "training", "models", "seeds", "method_modules"}  # set by the pipeline, not by a part


METHODS: dict[str, Method] = {}
TERMS: dict[str, Term] = {}
_MODULES: dict[tuple[str, str], str] = {}  # ("method" | "term", name) -> the module outside the package defining it


def _add(spec: Method | Term, module: str | None) -> None:
    """Add a method or loss term; ``module`` is what a training job imports to find it (None: this
    package's). A name or key already taken is refused, and so is a term key a run already uses."""
    if isinstance(spec, Method):
        if spec.name in METHODS:
            by = _MODULES.get(("method", spec.name), __package__)
            raise ValueError(f"method {spec.name!r} is registered already (by {by})")
        METHODS[spec.name] = spec
        if module:
            _MODULES[("method", spec.name)] = module
    elif isinstance(spec, Term):
        if spec.key in TERMS or spec.key in BASE or spec.key in RUN_KEYS:
            raise ValueError(f"loss term key {spec.key!r} is taken (run keys: {', '.join([*BASE, *RUN_KEYS, *TERMS])})")
        TERMS[spec.key] = spec
        if module:
            _MODULES[("term", spec.key)] = module
    else:
        raise TypeError(f"METHOD is a Method and TERM a Term, not {type(spec).__name__}")


def _read(module, outside: bool) -> None:
    """Register the ``METHOD`` and ``TERM`` ``module`` defines (a module defining neither is refused)."""
    specs = [getattr(module, kind) for kind in ("METHOD", "TERM") if hasattr(module, kind)]
    if not specs:
        raise ValueError(f"module {module.__name__!r} defines neither METHOD nor TERM (ar2dlm.methods.spec)")
    for spec in specs:
        _add(spec, module.__name__ if outside else None)


def import_methods(modules: Iterable[str]) -> None:
    """Import the modules outside the package that define methods or loss terms and register them
    (each once)."""
    for name in modules:
        if name not in _MODULES.values():
            _read(importlib.import_module(name), outside=True)


# this package's own modules, in module-name order (the order terms' memory adds up in)
for _name in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
    if _name not in ("registry", "spec"):
        _read(importlib.import_module(f"{__package__}.{_name}"), outside=False)


class SettingsError(ValueError):
    """A run whose parts do not compose, naming its key under the run (``method``, a term's key)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def method(name: str) -> Method:
    if name not in METHODS:
        raise SettingsError("method", f"no method {name!r} (registered: {', '.join(METHODS)})")
    return METHODS[name]


def settings(own: dict) -> dict:
    """A run's settings from its own keys: :data:`BASE`, its method's defaults over it, its own keys
    over those; each loss term it names filled in from the term's defaults, each it does not None;
    ``method_modules``: the modules outside the package that its method and terms come from. A
    method or term combination that does not compose raises :class:`SettingsError`."""
    spec = method(own["method"])
    out = deep_merge(deep_merge({**BASE, **{key: None for key in TERMS}}, spec.defaults), own)
    for key, term in TERMS.items():
        if out[key] is not None:
            out[key] = deep_merge(term.defaults, out[key])
    compose(out)
    modules = sorted(
        {_MODULES[p] for p in [("method", spec.name), *(("term", t.key) for t in present(out))] if p in _MODULES}
    )
    if modules:
        out["method_modules"] = modules
    return out


def present(run: dict) -> list[Term]:
    """The loss terms a run names."""
    return [t for t in TERMS.values() if run.get(t.key) is not None]


class Composition(NamedTuple):
    """A run's method, the part that gives it its objective (a term that brings one, else the
    method) and the terms added to that objective."""

    method: Method
    main: Part
    added: list[Term]


def compose(run: dict) -> Composition:
    spec = method(run["method"])
    named = present(run)
    bringing = [t for t in named if t.objective is not None]
    if len(bringing) > 1:
        raise SettingsError(
            bringing[1].key, f"{' and '.join(t.noun for t in bringing)} each bring their own objective; a run takes one"
        )
    main = bringing[0] if bringing else spec
    added = [t for t in named if t.loss is not None and t.active(run)]
    if added and not main.takes_terms:
        raise SettingsError(added[0].key, f"the objective of {main} takes no added loss terms")
    return Composition(spec, main, added)


def active_parts(run: dict) -> list[Part]:
    """The method and the terms the run computes: whose memory, FLOPs and decoding the planner counts."""
    return [method(run["method"]), *(t for t in present(run) if t.active(run))]


def step_length(run: dict) -> int:
    """The longest row a step of the run trains on: ``training.seq_len``, or longer where a part says
    so (``Part.positions``)."""
    return max([run["training"]["seq_len"], *(p.positions(run) for p in active_parts(run) if p.positions)])


def teacher_of(run: dict) -> tuple[bool, bool]:
    """(reads a frozen teacher, reads its logits) of a run's objective and added terms."""
    c = compose(run)
    return teacher_reads([c.main.teacher, *(t.teacher for t in c.added)])


def training_data(run: dict, prompt_sets: dict) -> tuple[str, str]:
    """(source, selection) of a run's token rows: what the part giving its objective trains on,
    else the run's ``data`` cut with every document, packed (``training.rows: packed``, the default)
    or one document per row (``documents``: the evaluation's layout, ``ar2dlm.data.token_rows``)."""
    hook = compose(run).main.training_data
    if hook:
        return hook(run, prompt_sets)
    return run["data"], "document_rows" if row_layout(run) == "documents" else "documents"


def problems(run: dict, config: dict):
    """Cross-key problems of a resolved run, as (key under the run, message): the terms its method
    requires, then the checks of the method and of each term it names."""
    spec = method(run["method"])
    for key in spec.requires:
        if run.get(key) is None:
            yield key, f"method {spec.name} needs {TERMS[key].noun}"
    for part in [spec, *present(run)]:
        yield from part.checks(run, config)


def objective_for(run: dict, conv, seed: int):
    """The objective a run's settings compose (the trainer's one entry): its method's, or that of a
    term that brings one, with the active added terms riding on it. The objective's class is
    imported here, and must be what its declaration says: what it reads of the teacher (the planner
    counted that) and whether added terms ride on it (a ``ComposedObjective``, with ``added_terms``)."""
    import_methods(run.get("method_modules", []))
    c = compose(run)
    cls = load(c.main.objective)
    declared = teacher_reads([c.main.teacher])
    if (cls.needs_teacher, cls.teacher_head) != declared:
        raise ValueError(
            f"{c.main} declares teacher={c.main.teacher!r}, but its objective {cls.__name__} reads "
            f"(needs_teacher, teacher_head) = {(cls.needs_teacher, cls.teacher_head)}"
        )
    if hasattr(cls, "added_terms") != c.main.takes_terms:
        raise ValueError(
            f"{c.main} declares takes_terms={c.main.takes_terms}, but its objective {cls.__name__} "
            f"{'is' if hasattr(cls, 'added_terms') else 'is not'} a ComposedObjective"
        )
    return cls(run, conv, seed, c.added) if c.main.takes_terms else cls(run, conv, seed)
