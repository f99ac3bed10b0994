"""Config loading: presets merged over the presets they extend, the schema (config/schema.yaml with
the method registry's names and loss terms) and its error named by key. Cross-key checks live in
``checks``; the config resolved into typed objects in ``resolved``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

from ..core.errors import ConfigError  # the pipeline's callers import it from here
from ..provenance import deep_merge

PRESETS = ("smoke", "tiny", "tiny_full", "paper", "paper_standin")
# libyaml's parser where PyYAML was built with it (its wheels are): the same documents, about 9x faster, and
# every Snakemake start and every SLURM job's own Snakemake reads these files
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _refuse_duplicate_keys(node: yaml.Node, path: Path, where: str = "") -> None:
    """PyYAML keeps the last of two equal keys in a mapping: a config file that sets a key twice is
    refused instead, naming the key and the lines of both settings."""
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` brings keys a later key may override
                continue
            key = f"{where}.{key_node.value}" if where else str(key_node.value)
            if key in seen:
                raise ConfigError(
                    key, f"set twice in {path} (lines {seen[key] + 1} and {key_node.start_mark.line + 1}): keep one"
                )
            seen[key] = key_node.start_mark.line
            _refuse_duplicate_keys(value, path, key)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, path, f"{where}[{i}]")


def read_config_file(path: str | Path) -> dict:
    """A config file (YAML or JSON) as a dict, refusing a key set twice."""
    path = Path(path)
    loader = LOADER(path.read_text())
    try:
        node = loader.get_single_node()
        if node is not None:
            _refuse_duplicate_keys(node, path)
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "a config file holds a mapping of keys at its top level")
    return data


def load_preset(name: str, config_dir: str | Path) -> dict:
    """A preset file, merged over the preset it ``extends`` (if any)."""
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    preset = read_config_file(Path(config_dir) / "presets" / f"{name}.yaml")
    parent = preset.pop("extends", None)
    return deep_merge(load_preset(parent, config_dir), preset) if parent else preset


def merge_preset(config: dict, config_dir: str | Path) -> dict:
    """Merge the given config over ``config_dir/presets/<preset>.yaml``."""
    config = dict(config)
    config.pop("extends", None)
    return deep_merge(load_preset(config.get("preset", "tiny"), config_dir), config)


def import_config_methods(config: dict) -> None:
    """Import and register the modules the config's ``methods:`` names (each defines ``METHOD`` or
    ``TERM``); a module that does not import or defines neither is named by its key."""
    from ..methods.registry import import_methods

    modules = config.get("methods", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise ConfigError("methods", f"must be a list of module names, not {modules!r}")
    for i, module in enumerate(modules):
        try:
            import_methods([module])
        except Exception as exc:  # the module is the user's code: any failure to import it is a config error
            raise ConfigError(
                f"methods.{i}",
                f"importing {module!r} failed ({type(exc).__name__}: {exc}); its folder must be on PYTHONPATH",
            ) from None


def config_schema(schema_path: str | Path) -> dict:
    """The config's JSON schema: ``schema_path``, with the registered conversion methods as the
    names ``runs.*.method`` takes and each registered loss term's options as ``runs.*.<key>``."""
    from ..methods.registry import METHODS, TERMS

    schema = yaml.load(Path(schema_path).read_text(), Loader=LOADER)
    run = schema["properties"]["runs"]["additionalProperties"]["properties"]
    run["method"] = {**run["method"], "enum": [name for name, m in METHODS.items() if m.conversion]}
    run.update({key: term.schema for key, term in TERMS.items()})
    return schema


# YAML 1.1 (PyYAML, Snakemake's loader) reads ``1e-3`` as a string: it wants a dot and a signed
# exponent (``1.0e-3``). Every ML config writes learning rates the first way.
_SCIENTIFIC = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def read_numbers(value, key: str = ""):
    """``value`` with every string in scientific notation read as the number it writes, and every
    non-finite number (``.nan``, ``.inf``) refused naming its key."""
    if isinstance(value, dict):
        return {k: read_numbers(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [read_numbers(v, f"{key}.{i}") for i, v in enumerate(value)]
    if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key or "<top level>", f"{value} is not a finite number")
    return value


def validate_config(config: dict, schema_path: str | Path) -> None:
    """Validate a merged config against ``config_schema`` (after importing its ``methods:``
    modules); the first error, as jsonschema reports it, is raised as a ConfigError naming its key."""
    import jsonschema

    import_config_methods(config)
    validator = jsonschema.Draft202012Validator(config_schema(schema_path))
    err = next(iter(validator.iter_errors(config)), None)
    if err is None:
        return
    err = jsonschema.exceptions.best_match(err.context if err.context else [err])
    raise ConfigError(".".join(str(p) for p in err.absolute_path) or "<top level>", err.message)


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
        raise RuntimeError(
            f"this process imported another ar2dlm ({Path(ar2dlm.__file__).parent}), not the "
            f"checkout of this Snakefile ({mine})"
        )
    path = os.environ.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != basedir:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (basedir, path) if p)
