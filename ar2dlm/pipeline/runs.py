"""Conversion runs: a run names a method, whose defaults it starts from, and may compose further
loss terms (alignment, distillation) and options; the method registry (``ar2dlm.methods``) knows
them all. ``resolve_run`` gives the complete settings."""

from __future__ import annotations

import copy

from ..methods.registry import SettingsError, import_methods, settings
from ..provenance import deep_merge
from .config import ConfigError


def resolve_run(config: dict, name: str) -> dict:
    """The run's settings (``methods.registry.settings``: method defaults, then the run's own keys),
    then training = preset training + run overrides, its models and seeds."""
    if name not in config["runs"]:
        raise ConfigError(f"runs.{name}", f"no such run (known: {', '.join(config['runs'])})")
    import_methods(config.get("methods", []))
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
    return out


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
