"""Config loading: presets merged over the presets they extend, the schema error named by key, and a
benchmark's settings over the preset's decoding defaults. Cross-key checks live in ``checks``."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from ..core.errors import ConfigError  # the pipeline's callers import it from here

PRESETS = ("smoke", "tiny", "tiny_full", "paper", "paper_standin")


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_preset(name: str, config_dir: str | Path) -> dict:
    """A preset file, merged over the preset it ``extends`` (if any)."""
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    with open(Path(config_dir) / "presets" / f"{name}.yaml") as f:
        preset = yaml.safe_load(f)
    parent = preset.pop("extends", None)
    return deep_merge(load_preset(parent, config_dir), preset) if parent else preset


def merge_preset(config: dict, config_dir: str | Path) -> dict:
    """Merge the given config over ``config_dir/presets/<preset>.yaml``."""
    config = dict(config)
    config.pop("extends", None)
    return deep_merge(load_preset(config.get("preset", "tiny"), config_dir), config)


def describe_schema_error(exc: BaseException) -> str:
    """Turn the jsonschema error wrapped by ``snakemake.utils.validate`` into one line naming the key."""
    import jsonschema

    err = exc
    while err is not None and not isinstance(err, jsonschema.ValidationError):
        err = err.__cause__ or err.__context__
    if err is None:
        return str(exc)
    err = jsonschema.exceptions.best_match([err]) if not err.context else jsonschema.exceptions.best_match(err.context)
    key = ".".join(str(p) for p in err.absolute_path) or "<top level>"
    return f"invalid config: config key '{key}': {err.message}"


def benchmark_settings(config: dict, name: str) -> dict:
    """The benchmark's config over the preset's default decoding settings."""
    return deep_merge(config["eval"]["decoding"], config["eval"]["benchmarks"][name])


def use_checkout(basedir: str | Path) -> None:
    """Make every job run the ``ar2dlm`` of the checkout at ``basedir`` (the Snakefile's folder),
    whatever copy the environment has installed: it goes first on PYTHONPATH, which shell and script
    jobs (and SLURM jobs, which inherit the environment) put before site-packages. Fails if this
    process has already imported another copy."""
    import os

    import ar2dlm

    basedir = str(Path(basedir).resolve())
    mine = Path(basedir, "ar2dlm")
    if Path(ar2dlm.__file__).resolve().parent != mine:
        raise RuntimeError(f"this process imported another ar2dlm ({Path(ar2dlm.__file__).parent}), not the "
                           f"checkout of this Snakefile ({mine})")
    path = os.environ.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != basedir:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (basedir, path) if p)
