"""Config loading and the checks a JSON schema cannot express. Every error names the key."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

PRESETS = ("smoke", "tiny", "paper")
SYNTHETIC_DOMAINS = {"code": "code_suite", "math": "math_suite"}


class ConfigError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(f"config key '{key}': {message}")
        self.key = key


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


def check_config(config: dict) -> None:
    """Cross-key checks, run when the DAG is built, before any job starts."""
    from .data.code_suite import split_pairings

    data = config["data"]
    corpus = data["corpus"]
    if corpus["subset_tokens"] > corpus["stream_tokens"]:
        raise ConfigError("data.corpus.subset_tokens", f"the subset ({corpus['subset_tokens']} tokens) is larger than "
                          f"its source, data.corpus.stream_tokens ({corpus['stream_tokens']})")
    if corpus["source"] == "hub" and corpus["hub"] is None:
        raise ConfigError("data.corpus.hub", "source: hub needs a hub data set (path, split, text_field or prompt/completion fields)")
    if corpus["source"] == "synthetic" and corpus["hub"] is not None:
        raise ConfigError("data.corpus.hub", "is only used with data.corpus.source: hub")
    if corpus["hub"] is not None and not corpus["hub"].get("text_field") and not (
            corpus["hub"].get("prompt_field") and corpus["hub"].get("completion_field")):
        raise ConfigError("data.corpus.hub", "needs text_field, or prompt_field and completion_field")
    if corpus["source"] == "synthetic" and not corpus["materialize_stream"]:
        raise ConfigError("data.corpus.materialize_stream", "a synthetic corpus is always written out; set it to true")

    try:
        split_pairings(data["code_suite"]["heldout_fraction"], data["seed"])
    except ValueError as exc:
        raise ConfigError("data.code_suite.heldout_fraction", str(exc)) from None

    prefs = data["preferences"]
    for name, dom in prefs["domains"].items():
        if dom["source"] == "synthetic":
            if name not in SYNTHETIC_DOMAINS:
                raise ConfigError(f"data.preferences.domains.{name}",
                                  f"no synthetic preference domain {name!r} (known: {', '.join(SYNTHETIC_DOMAINS)})")
            suite = data[SYNTHETIC_DOMAINS[name]]
            for split in ("train", "eval"):
                n = dom.get(f"n_{split}", prefs[f"n_{split}"])
                if n > suite[f"n_{split}"]:
                    key = f"data.preferences.domains.{name}.n_{split}" if f"n_{split}" in dom else f"data.preferences.n_{split}"
                    raise ConfigError(key, f"{n} {name} pairs asked, larger than their source "
                                      f"data.{SYNTHETIC_DOMAINS[name]}.n_{split} ({suite[f'n_{split}']})")

    limit = config["eval"]["teacher_code"]["limit"]
    if limit is not None and limit > data["code_suite"]["n_eval"]:
        raise ConfigError("eval.teacher_code.limit",
                          f"{limit} tasks asked, larger than their source data.code_suite.n_eval ({data['code_suite']['n_eval']})")

    for name, model in config["models"].items():
        key = f"models.{name}"
        if model["source"] == "pretrain":
            for extra in ("hub_id", "model_path", "revision"):
                if extra in model:
                    raise ConfigError(f"{key}.{extra}", "is only used with source: hub")
            arch, pre = model["arch"], model["pretrain"]
            if arch["hidden_size"] % arch["num_attention_heads"]:
                raise ConfigError(f"{key}.arch.num_attention_heads",
                                  f"must divide hidden_size ({arch['hidden_size']})")
            if arch["num_attention_heads"] % arch["num_key_value_heads"]:
                raise ConfigError(f"{key}.arch.num_key_value_heads",
                                  f"must divide num_attention_heads ({arch['num_attention_heads']})")
            if pre["seq_len"] > arch["max_position_embeddings"]:
                raise ConfigError(f"{key}.pretrain.seq_len",
                                  f"{pre['seq_len']} exceeds arch.max_position_embeddings ({arch['max_position_embeddings']})")
            if pre["warmup_steps"] >= pre["steps"]:
                raise ConfigError(f"{key}.pretrain.warmup_steps", f"must be below pretrain.steps ({pre['steps']})")
        else:
            for extra in ("arch", "pretrain"):
                if extra in model:
                    raise ConfigError(f"{key}.{extra}", "is only used with source: pretrain")
            path = model["model_path"]
            if path is not None and not (Path(path) / "config.json").is_file():
                raise ConfigError(f"{key}.model_path", f"missing checkpoint: {path!r} is not a Hugging Face model "
                                  "folder (no config.json)")

    from .runs import check_runs, resolve_run

    check_runs(config)

    bench = config["bench"]
    if bench["model"] not in config["models"]:
        raise ConfigError("bench.model", f"{bench['model']!r} is not a key of models ({', '.join(config['models'])})")
    if bench["run"] not in config["runs"]:
        raise ConfigError("bench.run", f"{bench['run']!r} is not a key of runs")
    timed = resolve_run(config, bench["run"])
    if timed["attention"] != "block" or bench["model"] not in timed["models"]:
        raise ConfigError("bench.run", f"the decode benchmark times a block-attention run of {bench['model']}; "
                          f"{bench['run']!r} is {timed['attention']} on {timed['models']}")
    if timed["block_size"] != bench["block_size"]:
        raise ConfigError("bench.block_size", f"{bench['block_size']} differs from run {bench['run']}'s block size "
                          f"{timed['block_size']}")
    if bench["ratio_length"] not in bench["lengths"]:
        raise ConfigError("bench.ratio_length", f"{bench['ratio_length']} is not one of bench.lengths {bench['lengths']}")
    if bench["max_new_tokens"] % bench["block_size"]:
        raise ConfigError("bench.max_new_tokens", f"block size {bench['block_size']} does not divide the length "
                          f"{bench['max_new_tokens']}")
    for key in ("lengths", "cache_lengths"):
        for length in bench[key]:
            if length % bench["block_size"]:
                raise ConfigError(f"bench.{key}", f"block size {bench['block_size']} does not divide the length {length}")
