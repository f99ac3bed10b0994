"""The hub assets a config needs: every hub repository its models, tokenizer, data sets and the
lm-eval / mteb tasks of its benchmarks read, each once, with the config keys that use it (what
``snakemake prefetch`` downloads and the DAG build checks the cache for)."""

from __future__ import annotations

from ..core.hub import HubAsset, is_hub_id
from ..evaluation.suite import BENCHMARK_KINDS


def hub_assets(config: dict) -> list[HubAsset]:
    """Every hub repository the config needs, each once, with the config keys that use it."""
    wanted: dict[tuple, list[str]] = {}

    def add(repo_type, path, revision, key):
        if is_hub_id(path):
            wanted.setdefault((repo_type, path, revision), []).append(key)

    for name, m in config["models"].items():
        if m["source"] == "hub" and not m.get("model_path"):
            add("model", m["hub_id"], m.get("revision"), f"models.{name}")
    data = config["data"]
    if data["tokenizer"]["source"] == "pretrained":
        add("model", data["tokenizer"]["path"], None, "data.tokenizer")
    if data["corpus"]["source"] == "hub":
        add("dataset", data["corpus"]["hub"]["path"], None, "data.corpus")
    for d, spec in data["preferences"]["domains"].items():
        if spec["source"] == "hub":
            add("dataset", spec["path"], None, f"data.preferences.domains.{d}")
    for p, spec in data["prompt_sets"].items():
        add("dataset", spec["path"], None, f"data.prompt_sets.{p}")
    for b, spec in config["eval"]["benchmarks"].items():
        for repo_type, path, revision in BENCHMARK_KINDS[spec["kind"]].hub_assets(spec):
            add(repo_type, path, revision, f"eval.benchmarks.{b}")
    return [HubAsset(p, t, r, tuple(keys)) for (t, p, r), keys in wanted.items()]


def assets_for(assets: list[HubAsset], key: str) -> list[HubAsset]:
    """The assets a config key (or a key below it) uses."""
    return [a for a in assets if any(k == key or k.startswith(key + ".") for k in a.used_by)]
