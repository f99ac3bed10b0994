"""Conversion runs: a run names a method, whose defaults it starts from, and may compose further
loss terms (alignment, distillation) and options; the method registry (``ar2dlm.methods``) knows
them all. A :class:`Run` holds a run's complete settings, resolved once (``resolve_runs``)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ..methods.registry import SettingsError, import_methods, settings
from ..provenance import deep_merge
from .config import ConfigError


@dataclass(frozen=True, eq=False)
class Run(Mapping):
    """One run's settings: its method's defaults, then the run's own keys (``methods.registry.settings``);
    ``training`` = the preset's training + the run's overrides; its models and seeds. Read-only: a key
    reads a copy of its value, and ``as_dict`` gives the whole (for a job's JSON)."""

    name: str
    _settings: dict = field(repr=False)

    def __getitem__(self, key: str):
        return copy.deepcopy(self._settings[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings)

    def __len__(self) -> int:
        return len(self._settings)

    def as_dict(self) -> dict:
        return copy.deepcopy(self._settings)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._settings["models"])

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(self._settings["seeds"])

    @property
    def steps(self) -> int:
        return self._settings["training"]["steps"]

    @property
    def attention(self) -> str:
        return self._settings["attention"]

    @property
    def block_size(self) -> int | None:
        return self._settings["block_size"]

    @property
    def init_run(self) -> str | None:
        """The run this one starts from (``init: {run: NAME}``), else None."""
        init = self._settings["init"]
        return init["run"] if isinstance(init, dict) else None

    def checkpoint_steps(self) -> list[int]:
        """Steps at which the run writes a checkpoint (every K steps and the last)."""
        t = self._settings["training"]
        return sorted({*range(t["checkpoint_every"], t["steps"] + 1, t["checkpoint_every"]), t["steps"]})


def _resolve_run(config: dict, name: str) -> Run:
    run = copy.deepcopy(config["runs"][name])
    try:
        out = settings(run)
    except SettingsError as exc:
        raise ConfigError(f"runs.{name}.{exc.key}", str(exc)) from None
    out["training"] = deep_merge(config["training"], run.get("training", {}))
    out["models"] = run.get("models", list(config["models"]))
    out["seeds"] = run.get("seeds", [config["seed"]])
    out["name"] = name
    init_chain(config, name)
    return Run(name, out)


def resolve_runs(config: dict) -> dict[str, Run]:
    """Every run of ``config["runs"]``, resolved once (after importing the config's ``methods:``)."""
    import_methods(config.get("methods", []))
    return {name: _resolve_run(config, name) for name in config["runs"]}


def init_chain(config: dict, name: str) -> list[str]:
    """The runs a run starts from, nearest first (``init: {run: NAME}``), checked to exist and not
    to loop."""
    chain, seen = [], {name}
    init = config["runs"][name].get("init")
    while isinstance(init, dict):
        source = init["run"]
        if source not in config["runs"]:
            raise ConfigError(f"runs.{name}.init.run", f"no such run {source!r} (known: {', '.join(config['runs'])})")
        if source in seen:
            raise ConfigError(
                f"runs.{name}.init.run",
                f"the runs start from each other in a loop: {' -> '.join([name, *chain, source])}",
            )
        chain.append(source)
        seen.add(source)
        init = config["runs"][source].get("init")
    return chain
