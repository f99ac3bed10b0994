"""Cross-key checks of a merged config, the ones a JSON schema cannot express, run when the DAG is
built, before any job starts. Every error names the key."""

from __future__ import annotations

import glob
import json
from dataclasses import replace
from pathlib import Path

from ..core.conventions import block_misfit
from ..data.code_suite import split_pairings
from ..evaluation.suite import BENCHMARK_KINDS
from ..methods.registry import problems, training_data
from ..training.schedule import warmup_misfit
from ..training.tracking import missing_package
from .claims import BEST_OTHER, HEADLINE, STUDY_CLAIM_KEYS, TEACHER, TRAINING, TRAINING_METRICS, Claim, claim_merges
from .config import ConfigError, merge_preset, read_numbers, validate_config
from .jobs import armap_domains, direct_objectives
from .resolved import Resolved, resolve

SYNTHETIC_DOMAINS = {"code": "code_suite", "math": "math_suite"}  # preference domains built from a suite


def checked_config(config: dict, config_dir: str | Path) -> Resolved:
    """``config`` over its preset, validated against the schema and by the cross-key checks, and
    resolved: what the Snakefile builds the DAG from (a ConfigError names the first bad key)."""
    merged = read_numbers(merge_preset(config, config_dir))
    validate_config(merged, Path(config_dir) / "schema.yaml")
    return check_config(merged)


def check_config(config: dict) -> Resolved:
    """Cross-key checks, run when the DAG is built, before any job starts; the config resolved."""
    check_data(config)
    check_models(config)
    check_prompt_sets(config)
    resolved = resolve(config)
    check_runs(resolved)
    check_evals(resolved)
    check_armap(resolved)
    check_claims(resolved)
    check_local_files(config)
    check_bench(resolved)
    check_lengths(config)
    package = missing_package(config["tracking"]["backend"])
    if package:
        raise ConfigError(
            "tracking.backend",
            f"{config['tracking']['backend']} needs the {package} package, which "
            f"this environment lacks (pip install {package})",
        )
    return resolved


def check_data(config: dict) -> None:
    """The data sections fit their sources: the corpus, the preference domains, the teacher's code tasks."""
    data = config["data"]
    corpus = data["corpus"]
    if corpus["subset_tokens"] > corpus["stream_tokens"]:
        raise ConfigError(
            "data.corpus.subset_tokens",
            f"the subset ({corpus['subset_tokens']} tokens) is larger than "
            f"its source, data.corpus.stream_tokens ({corpus['stream_tokens']})",
        )
    if corpus["source"] == "hub" and corpus["hub"] is None:
        raise ConfigError(
            "data.corpus.hub", "source: hub needs a hub data set (path, split, text_field or prompt/completion fields)"
        )
    if corpus["source"] == "synthetic" and corpus["hub"] is not None:
        raise ConfigError("data.corpus.hub", "is only used with data.corpus.source: hub")
    if (
        corpus["hub"] is not None
        and not corpus["hub"].get("text_field")
        and not (corpus["hub"].get("prompt_field") and corpus["hub"].get("completion_field"))
    ):
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
                raise ConfigError(
                    f"data.preferences.domains.{name}",
                    f"no synthetic preference domain {name!r} (known: {', '.join(SYNTHETIC_DOMAINS)})",
                )
            suite = data[SYNTHETIC_DOMAINS[name]]
            for split in ("train", "eval"):
                n = dom.get(f"n_{split}", prefs[f"n_{split}"])
                if n > suite[f"n_{split}"]:
                    key = (
                        f"data.preferences.domains.{name}.n_{split}"
                        if f"n_{split}" in dom
                        else f"data.preferences.n_{split}"
                    )
                    raise ConfigError(
                        key,
                        f"{n} {name} pairs asked, larger than their source "
                        f"data.{SYNTHETIC_DOMAINS[name]}.n_{split} ({suite[f'n_{split}']})",
                    )

    limit = config["eval"]["teacher_code"]["limit"]
    if limit is not None and limit > data["code_suite"]["n_eval"]:
        raise ConfigError(
            "eval.teacher_code.limit",
            f"{limit} tasks asked, larger than their source data.code_suite.n_eval ({data['code_suite']['n_eval']})",
        )


def check_models(config: dict) -> None:
    """Each model is pretrained here (its architecture and schedule consistent) or read from the hub or a
    local folder, with only the keys of its source."""
    for name, model in config["models"].items():
        key = f"models.{name}"
        if model["source"] == "pretrain":
            for extra in ("hub_id", "model_path", "revision"):
                if extra in model:
                    raise ConfigError(f"{key}.{extra}", "is only used with source: hub")
            arch, pre = model["arch"], model["pretrain"]
            if arch["hidden_size"] % arch["num_attention_heads"]:
                raise ConfigError(f"{key}.arch.num_attention_heads", f"must divide hidden_size ({arch['hidden_size']})")
            if arch["num_attention_heads"] % arch["num_key_value_heads"]:
                raise ConfigError(
                    f"{key}.arch.num_key_value_heads",
                    f"must divide num_attention_heads ({arch['num_attention_heads']})",
                )
            if pre["seq_len"] > arch["max_position_embeddings"]:
                raise ConfigError(
                    f"{key}.pretrain.seq_len",
                    f"{pre['seq_len']} exceeds arch.max_position_embeddings ({arch['max_position_embeddings']})",
                )
            if problem := warmup_misfit(pre["warmup_steps"], pre["steps"]):
                raise ConfigError(f"{key}.pretrain.warmup_steps", problem)
        else:
            for extra in ("arch", "pretrain"):
                if extra in model:
                    raise ConfigError(f"{key}.{extra}", "is only used with source: pretrain")
            path = model["model_path"]
            if path is not None and not (Path(path) / "config.json").is_file():
                raise ConfigError(
                    f"{key}.model_path",
                    f"missing checkpoint: {path!r} is not a Hugging Face model folder (no config.json)",
                )


LENGTH_KEYS = ("seq_len", "max_length", "max_new_tokens", "rollout_length", "cost_context")


def model_positions(model: dict) -> int | None:
    """The positions a model has (its config's max_position_embeddings), where the DAG build can read them
    offline: the preset's architecture, a local checkpoint, or the hub cache (None before a prefetch)."""
    if model["source"] == "pretrain":
        return model["arch"]["max_position_embeddings"]
    if model.get("model_path"):
        found = Path(model["model_path"]) / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model["hub_id"], "config.json", revision=model.get("revision"))
    if not isinstance(found, (str, Path)) or not Path(found).is_file():
        return None
    return json.loads(Path(found).read_text()).get("max_position_embeddings")


def check_lengths(config: dict) -> None:
    """Every sequence length the config sets (training rows, DPO pairs, rollouts, generations) within the
    positions of each model it feeds: a run's lengths against its own models, the rest against every model.
    (RoPE models run past their positions without an error, on positions they never trained.)"""
    positions = {name: model_positions(m) for name, m in config["models"].items()}

    def walk(value, key: str, models: list[str]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                sub = f"{key}.{k}" if key else k
                if key == "runs":
                    walk(v, sub, [m for m in v.get("models", models) if m in positions])
                elif key != "models":
                    walk(v, sub, models)
        elif key.rsplit(".", 1)[-1] in LENGTH_KEYS and isinstance(value, int):
            for m in models:
                if positions[m] is not None and value > positions[m]:
                    raise ConfigError(
                        key,
                        f"{value} tokens, more than model {m!r} has positions (max_position_embeddings {positions[m]})",
                    )

    walk(config, "", list(positions))


def bf16_keys(config: dict) -> list[str]:
    """The config keys that ask for bf16 explicitly (``auto`` resolves per job)."""
    keys = [
        f"models.{n}.pretrain.dtype"
        for n, m in config["models"].items()
        if m.get("pretrain", {}).get("dtype") == "bf16"
    ]
    keys += ["training.dtype"] if config["training"]["dtype"] == "bf16" else []
    keys += [
        f"runs.{n}.training.dtype" for n, r in config["runs"].items() if r.get("training", {}).get("dtype") == "bf16"
    ]
    keys += ["eval.decoding.dtype"] if config["eval"]["decoding"]["dtype"] == "bf16" else []
    keys += [f"eval.benchmarks.{n}.dtype" for n, b in config["eval"]["benchmarks"].items() if b.get("dtype") == "bf16"]
    return keys


def emulated_bf16_warning(config: dict) -> str | None:
    """A warning when the config asks for bf16 explicitly and its jobs run on this machine's CPU
    (no ``cluster:``: the presets whose jobs run where Snakemake runs), which has no native bf16."""
    from ..core.precision import SLOWDOWN, cpu_native_bf16, cuda_native_bf16
    from ..provenance import machine

    keys = bf16_keys(config)
    if not keys or config.get("cluster") or cuda_native_bf16() or cpu_native_bf16():
        return None
    facts = machine()
    return (
        f"{', '.join(keys)} ask(s) for bf16, which this CPU ({facts['cpu']}, {facts['kernels']} kernels, no "
        f"AVX512_BF16 or AMX) emulates about {SLOWDOWN}x slower than fp32; the jobs still run in bf16. "
        "Set dtype: auto to compute in fp32 here and in bf16 where the hardware has it."
    )


def check_bench(resolved: Resolved) -> None:
    config = resolved.config
    bench = config["bench"]
    if bench["model"] not in config["models"]:
        raise ConfigError("bench.model", f"{bench['model']!r} is not a key of models ({', '.join(config['models'])})")
    if bench["run"] not in config["runs"]:
        raise ConfigError("bench.run", f"{bench['run']!r} is not a key of runs")
    for role, run in bench["train_runs"].items():
        if run not in config["runs"]:
            raise ConfigError(f"bench.train_runs.{role}", f"{run!r} is not a key of runs")
    timed = resolved.run(bench["run"])
    if timed.attention != "block" or bench["model"] not in timed.models:
        raise ConfigError(
            "bench.run",
            f"the decode benchmark times a block-attention run of {bench['model']}; "
            f"{bench['run']!r} is {timed.attention} on {list(timed.models)}",
        )
    spec = config["eval"]["benchmarks"].get(bench["benchmark"])
    if spec is None or spec["kind"] != "code":
        raise ConfigError(
            "bench.benchmark",
            f"{bench['benchmark']!r} is not a code benchmark of eval.benchmarks (its problems are decoded)",
        )
    if spec.get("limit") and bench["task_prompts"] > spec["limit"]:
        raise ConfigError(
            "bench.task_prompts",
            f"{bench['task_prompts']} prompts, but benchmark {bench['benchmark']} keeps {spec['limit']}",
        )
    if problem := block_misfit(timed.block_size, bench["max_new_tokens"], "the generation length"):
        raise ConfigError("bench.max_new_tokens", f"run {bench['run']}'s {problem}")


# Rows of the hub splits the presets name (from each data set's card), so a prompt set asking for
# more is caught when the DAG is built rather than after its download.
KNOWN_SPLIT_ROWS = {
    ("EleutherAI/hendrycks_math", "algebra", "train"): 1744,
    ("EleutherAI/hendrycks_math", "algebra", "test"): 1187,
    ("HuggingFaceH4/ultrachat_200k", None, "train_sft"): 207865,
}


def check_prompt_sets(config: dict) -> None:
    for name, spec in config["data"]["prompt_sets"].items():
        known = KNOWN_SPLIT_ROWS.get((spec["path"], spec.get("name"), spec["split"]))
        if known is not None and spec["n"] > known:
            raise ConfigError(
                f"data.prompt_sets.{name}.n",
                f"asks for {spec['n']} prompts but {spec['path']} ({spec.get('name')}, {spec['split']}) holds {known}",
            )


def check_micro_batches(config: dict, name: str, tr: dict) -> None:
    """A run's batch splits into ``grad_accum`` micro-batches, and each micro-batch over the
    processes it trains on: one without a ``cluster:``, else the GPUs of some launch the planner
    may choose (whole nodes of ``gpus_per_node``, up to ``max_nodes``)."""
    own = config["runs"][name].get("training", {})
    key = f"runs.{name}.training.grad_accum" if {"grad_accum", "batch_size"} & set(own) else "training.grad_accum"
    micro, rest = divmod(tr["batch_size"], tr["grad_accum"])
    if rest:
        raise ConfigError(
            key, f"run {name}: {tr['grad_accum']} micro-batches do not divide batch_size {tr['batch_size']}"
        )
    cluster = config.get("cluster")
    if cluster:
        launches = [n * cluster["gpus_per_node"] for n in range(1, cluster["max_nodes"] + 1)]
        if not any(micro % g == 0 for g in launches):
            raise ConfigError(
                key,
                f"run {name}: micro-batches of {micro} rows (batch_size {tr['batch_size']} / grad_accum "
                f"{tr['grad_accum']}) split over no launch the planner may choose ({', '.join(map(str, launches))} "
                "GPUs: cluster.gpus_per_node per node, up to cluster.max_nodes)",
            )


def check_runs(resolved: Resolved) -> None:
    """Cross-key checks of every run and study, with the key named."""
    config = resolved.config
    models = config["models"]
    for name, run in resolved.runs.items():
        key = f"runs.{name}"
        if name == "teacher":
            raise ConfigError(key, "'teacher' names the AR teacher's folder; give the run another name")
        for m in run.models:
            if m not in models:
                raise ConfigError(f"{key}.models", f"{m!r} is not a key of models ({', '.join(models)})")
        tr = run["training"]
        check_micro_batches(config, name, tr)
        if problem := warmup_misfit(tr["warmup_steps"], tr["steps"]):
            raise ConfigError(f"{key}.training.warmup_steps", problem)
        tokens = tr["steps"] * tr["batch_size"] * tr["seq_len"]  # packed rows: every slot a token
        stream = config["data"]["corpus"]["stream_tokens"]
        packed_stream = training_data(run, config["data"]["prompt_sets"]) == ("stream", "documents")
        if packed_stream and tokens > stream:
            raise ConfigError(
                f"{key}.training",
                f"{tr['steps']} steps x {tr['batch_size']} rows x {tr['seq_len']} tokens "
                f"= {tokens / 1e9:.1f}B tokens, more than the stream provides "
                f"(data.corpus.stream_tokens = {stream / 1e9:.1f}B): the run would repeat it",
            )
        needs_block = run["attention"] == "block" or run["masking"] == "positional"
        if needs_block and run["block_size"] is None:
            raise ConfigError(f"{key}.block_size", "block attention and position-dependent masking need a block size")
        if needs_block and (problem := block_misfit(run["block_size"], tr["seq_len"], "the sequence length")):
            raise ConfigError(f"{key}.block_size", problem)
        for sub, message in problems(run, config):  # its method's and loss terms' own checks
            raise ConfigError(f"{key}.{sub}", message)
    for study in resolved.studies.values():  # resolving a study checks that its runs exist
        for r in study.spec.get("run_seeds", {}):
            if r not in study.runs:
                raise ConfigError(
                    f"studies.{study.name}.run_seeds", f"{r!r} is not one of the study's runs ({', '.join(study.runs)})"
                )
        for m in study.spec.get("models", []):
            if m not in models:
                raise ConfigError(f"studies.{study.name}.models", f"{m!r} is not a key of models")


LINES_CHECKED = 100_000  # lines of a local JSONL file parsed at DAG build (a job reads the rest)


def _data_files(spec) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    return [f for v in (spec.values() if isinstance(spec, dict) else spec) for f in _data_files(v)]


def check_local_file(key: str, pattern: str) -> None:
    """A local data file (or glob) the config names: it exists, holds rows, and its first
    ``LINES_CHECKED`` JSONL lines parse; errors name the key, the file and the line."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    if not paths:
        raise ConfigError(key, f"{pattern!r} matches no file")
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(key, f"no such file: {path}")
        if Path(path).stat().st_size == 0:
            raise ConfigError(key, f"{path} is empty")
        if not path.endswith(".jsonl"):
            continue
        rows = 0
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if n > LINES_CHECKED:
                    break
                if line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ConfigError(key, f"{path}, line {n}: not valid JSON ({exc.msg})") from None
                    rows += 1
        if not rows:
            raise ConfigError(key, f"{path} holds no rows")


def check_local_files(config: dict) -> None:
    """Every local file the config reads data from (problems, corpora, preference pairs, prompt sets)."""
    data = config["data"]
    specs = {"data.corpus.hub": data["corpus"]["hub"]} if data["corpus"]["source"] == "hub" else {}
    specs |= {
        f"data.preferences.domains.{d}": s for d, s in data["preferences"]["domains"].items() if s["source"] == "hub"
    }
    specs |= {f"data.prompt_sets.{p}": s for p, s in data["prompt_sets"].items()}
    for key, spec in specs.items():
        for f in _data_files(spec.get("data_files")):
            check_local_file(f"{key}.data_files", f)
    for name, b in config["eval"]["benchmarks"].items():
        if b.get("source") == "path":
            check_local_file(f"eval.benchmarks.{name}.path", b["path"])


def check_evals(resolved: Resolved) -> None:
    """Every benchmark fits its data (its kind's own checks too), and each a study names exists and fits
    the runs it evaluates."""
    config = resolved.config
    benches, data = config["eval"]["benchmarks"], config["data"]
    for name, b in benches.items():
        key = f"eval.benchmarks.{name}"
        kind = BENCHMARK_KINDS[b["kind"]]
        suite = kind.suite
        if suite and b.get("source", "suite") == "suite" and b.get("limit") and b["limit"] > data[suite]["n_eval"]:
            raise ConfigError(
                f"{key}.limit",
                f"{b['limit']} tasks asked, larger than their source data.{suite}.n_eval ({data[suite]['n_eval']})",
            )
        for sub, problem in kind.checks(b, data):
            raise ConfigError(f"{key}.{sub}", problem)
    for study, spec in config["studies"].items():
        for e in spec["evals"]:
            if e not in benches:
                raise ConfigError(
                    f"studies.{study}.evals", f"{e!r} is not a key of eval.benchmarks ({', '.join(benches)})"
                )
            b = {**config["eval"]["decoding"], **benches[e]}
            kind = BENCHMARK_KINDS[b["kind"]]
            if not kind.decoded:
                continue
            blocks = [resolved.run(r).block_size for r in spec["runs"] if resolved.run(r).attention == "block"]
            # a kind with a row per decoding setting sweeps its block sizes and steps per block
            blocks += b.get("block_sizes", []) if kind.rows else [b["block_size"]]
            for bs in blocks:
                if problem := block_misfit(bs, b["max_new_tokens"], "the generation length"):
                    raise ConfigError(f"eval.benchmarks.{e}.max_new_tokens", f"{problem} (studies.{study})")
                if not kind.rows and (b.get("steps_per_block") or 0) > bs:
                    raise ConfigError(
                        f"eval.benchmarks.{e}.steps_per_block",
                        f"{b['steps_per_block']} steps exceed the block size {bs} (studies.{study}): "
                        "each step unmasks at least one position",
                    )


def check_armap(resolved: Resolved) -> None:
    config = resolved.config
    a, prefs = config["armap"], config["data"]["preferences"]
    for r in a["runs"]:
        if r not in config["runs"]:
            raise ConfigError("armap.runs", f"{r!r} is not a key of runs")
        if resolved.run(r).attention == "causal":
            raise ConfigError("armap.runs", f"{r!r} trains a causal model; AR-MAP transfers to DLMs")
    for d in a["domains"]:
        if d not in prefs["domains"]:
            raise ConfigError(
                "armap.domains", f"{d!r} is not a key of data.preferences.domains ({', '.join(prefs['domains'])})"
            )
    for d, benches in a["evals"].items():
        if d not in armap_domains(a):
            raise ConfigError("armap.evals", f"{d!r} is neither one of armap.domains nor 'all'")
        for b in benches:
            if b not in config["eval"]["benchmarks"]:
                raise ConfigError(f"armap.evals.{d}", f"{b!r} is not a key of eval.benchmarks")
    for m in a["eval_merges"]:
        if m not in a["merges"]:
            raise ConfigError("armap.eval_merges", f"{m!r} is not a key of armap.merges")
    for m, seeds in a.get("merge_seeds", {}).items():
        if m not in a["merges"]:
            raise ConfigError("armap.merge_seeds", f"{m!r} is not a key of armap.merges")
        if not set(seeds) <= set(a["seeds"]):
            raise ConfigError(
                f"armap.merge_seeds.{m}", f"{sorted(set(seeds) - set(a['seeds']))} not in armap.seeds {a['seeds']}"
            )
        if m in a["eval_merges"] or m in claim_merges(resolved.claims):
            raise ConfigError(
                f"armap.merge_seeds.{m}",
                "the evaluated merges and those AR-MAP's claims read "
                "(claims.judged) are searched on every seed of armap.seeds",
            )
    if not set(a.get("dlm_dpo_seeds", a["seeds"])) <= set(a["seeds"]):
        raise ConfigError(
            "armap.dlm_dpo_seeds",
            f"{sorted(set(a['dlm_dpo_seeds']) - set(a['seeds']))} not in armap.seeds {a['seeds']}",
        )
    runtimes = config.get("cluster", {}).get("armap_runtime_hours")  # planned: a runtime for each AR-MAP job kind
    for part in (f"dlm_{o}" for o in direct_objectives(a)):
        if runtimes is not None and part not in runtimes:
            raise ConfigError(f"cluster.armap_runtime_hours.{part}", f"missing: armap.{part}'s jobs need a runtime")
    parts = ("dpo", *(f"dlm_{o}" for o in direct_objectives(a)))
    for part in parts:
        if a[part]["batch_size"] % a[part].get("grad_accum", 1):
            raise ConfigError(
                f"armap.{part}.grad_accum",
                f"{a[part]['grad_accum']} micro-batches do not divide batch_size {a[part]['batch_size']}",
            )
    for part in (*parts, "gamma"):
        n = a[part]["eval_pairs"]
        for d in a["domains"]:
            have = prefs["domains"][d].get("n_eval", prefs["n_eval"])
            if n is not None and n > have:
                raise ConfigError(
                    f"armap.{part}.eval_pairs",
                    f"{n} pairs asked, larger than the {have} held-out {d} pairs (data.preferences)",
                )


def sandbox_problem(config: dict) -> str | None:
    """One line naming what keeps the bubblewrap sandbox from starting here, and its fix, when the
    config evaluates generated code; None when it starts (or nothing needs it)."""
    if not any(BENCHMARK_KINDS[b["kind"]].sandboxed for b in config["eval"]["benchmarks"].values()):
        return None
    from ..evaluation.sandbox import SandboxUnavailable, require_sandbox

    try:
        require_sandbox()
    except SandboxUnavailable as exc:
        return " ".join(str(exc).split())
    return None


def _claims(config: dict) -> dict:
    return config.get("claims", {}).get("judged", {})


def check_claims(resolved: Resolved) -> None:
    """Every claim names what exists: a study, runs of it, a benchmark of it and a metric that
    benchmark writes, or a merge of armap.merges."""
    config = resolved.config
    for c in resolved.claims:
        key = f"claims.judged.{c.id}"
        if c.armap is not None:
            if extra := [k for k in STUDY_CLAIM_KEYS if k in _claims(config)[c.id]]:
                raise ConfigError(
                    f"{key}.{extra[0]}",
                    "an AR-MAP claim (armap:) reads the gamma searches; "
                    f"{', '.join(STUDY_CLAIM_KEYS)} are a study claim's keys",
                )
            check_armap_claim(config["armap"], key, c.armap)
            relative_ok = c.armap["measure"] == "merged_vs_direct"
        else:
            if c.study not in resolved.studies:
                raise ConfigError(f"{key}.study", f"{c.study!r} is not a key of studies")
            check_claim_runs(resolved, key, c)
            check_claim_metric(resolved, key, c)
            benches = c.benchmark if isinstance(c.benchmark, list) else [c.benchmark]
            relative_ok = all(b == TRAINING or resolved.benchmarks[b].kind.scored for b in benches)
        if c.effect.get("unit") == "rel" and not relative_ok:
            raise ConfigError(
                f"{key}.effect.unit",
                "rel (percent of the compared arm's mean) needs a study claim on a scored benchmark or on "
                "training, or AR-MAP's merged_vs_direct; give the effect in the claim's measure (abs)",
            )


def check_armap_claim(a: dict, key: str, spec: dict) -> None:
    """An AR-MAP claim's merge is searched (and, compared with direct DLM DPO, evaluated), and the
    domains it orders are searched (``a``: the config's ``armap``)."""
    merge = spec.get("merge")
    if spec["measure"] == "shadowing":  # the task vectors' spectra: before any merge
        if merge is not None:
            raise ConfigError(f"{key}.armap.merge", "shadowing reads the task vectors' spectra, before any merge")
        return
    if merge is None:
        raise ConfigError(f"{key}.armap.merge", f"{spec['measure']} reads a merge's gamma searches: name one")
    if merge not in a["merges"]:
        raise ConfigError(f"{key}.armap.merge", f"{merge!r} is not a key of armap.merges ({', '.join(a['merges'])})")
    reference = {"vs_gamma_one": 1, "vs_no_transfer": 0}.get(spec["measure"])
    if reference is not None and reference not in a["gamma"]["grid"]:
        raise ConfigError("armap.gamma.grid", f"{key} compares with gamma {reference}, which the grid does not search")
    grid = a["gamma"]["grid"]
    if spec["measure"] == "above_one" and not (any(g > 1 for g in grid) and any(g <= 1 for g in grid)):
        raise ConfigError(
            "armap.gamma.grid", f"{key} compares gammas above 1 with those at or below: {grid} lacks one side"
        )
    if "baseline" in spec and spec["measure"] != "merged_vs_direct":
        raise ConfigError(
            f"{key}.armap.baseline", f"only merged_vs_direct compares with a baseline, not {spec['measure']}"
        )
    if spec["measure"] == "merged_vs_direct":
        if merge not in a["eval_merges"]:
            raise ConfigError(
                f"{key}.armap.merge",
                f"{merge!r} is not evaluated (armap.eval_merges: {', '.join(a['eval_merges'])}); merged_vs_direct "
                "compares its evaluations with the directly DPO'd DLM's",
            )
        if not a.get("dlm_dpo_seeds", a["seeds"]):
            raise ConfigError("armap.dlm_dpo_seeds", f"empty: {key} compares with the directly DPO'd DLM")
        baseline = spec.get("baseline", "dpo")
        if f"dlm_{baseline}" not in a:
            raise ConfigError(
                f"{key}.armap.baseline", f"{baseline!r} compares with armap.dlm_{baseline}, not configured"
            )
        if not any(a["evals"].get(d) for d in a["domains"]):
            raise ConfigError("armap.evals", f"no searched domain has a benchmark: {key} compares their scores")
    if spec["measure"] == "gamma_order":
        for side in ("lower", "higher"):
            if spec[side] not in a["domains"]:
                raise ConfigError(
                    f"{key}.armap.{side}", f"{spec[side]!r} is not one of armap.domains ({', '.join(a['domains'])})"
                )
        if spec["lower"] == spec["higher"]:
            raise ConfigError(f"{key}.armap.higher", f"orders {spec['lower']!r} against itself")


def check_claim_runs(resolved: Resolved, key: str, c: Claim) -> None:
    """The compared runs are the study's (or the teacher, or the best other run), on its model."""
    study = resolved.studies[c.study]
    runs, where = study.runs, f"the runs of studies.{c.study} ({', '.join(study.runs)})"
    if c.run not in runs:
        raise ConfigError(f"{key}.run", f"{c.run!r} is not one of {where}")
    if c.against not in runs and c.against not in (TEACHER, BEST_OTHER):
        raise ConfigError(f"{key}.against", f"{c.against!r} is neither teacher, best_other nor one of {where}")
    if c.against == BEST_OTHER and BEST_OTHER in runs:
        raise ConfigError(f"{key}.against", f"{BEST_OTHER} is ambiguous: the study has a run of that name")
    if c.against == c.run or (c.against == BEST_OTHER and len(runs) < 2):
        raise ConfigError(f"{key}.against", f"compares {c.run!r} with itself")
    if c.equal_flops and c.against == TEACHER:
        raise ConfigError(f"{key}.equal_flops", "the AR teacher has no training FLOPs to compare")
    models = study.models
    model = c.model or models[0]
    if model not in models:
        raise ConfigError(
            f"{key}.model", f"{model!r} is not one of the models of studies.{c.study} ({', '.join(models)})"
        )
    for r in (c.run, c.against):
        if r in runs and model not in resolved.run(r).models:
            raise ConfigError(f"{key}.model", f"run {r!r} does not train on {model!r}")


def check_claim_metric(resolved: Resolved, key: str, c: Claim, in_list: bool = False) -> None:
    """The claim's benchmark is one of its study's, and writes the metric it reads."""
    study, name, metric = c.study, c.benchmark, c.metric
    if isinstance(name, list):  # the mean over several benchmarks, each on its headline metric
        if metric != HEADLINE:
            raise ConfigError(f"{key}.metric", f"a claim on several benchmarks reads each one's {HEADLINE!r} metric")
        if c.decoding != "best":
            raise ConfigError(f"{key}.decoding", "a claim on several benchmarks reads each one's headline (best) row")
        for b in name:
            check_claim_metric(resolved, key, replace(c, benchmark=b), in_list=True)
        return
    if metric == HEADLINE and not in_list:
        raise ConfigError(f"{key}.metric", f"{HEADLINE!r} is the metric of a claim on a list of benchmarks")
    if name == TRAINING:
        if metric not in TRAINING_METRICS:
            known = ", ".join(TRAINING_METRICS)
            raise ConfigError(f"{key}.metric", f"{metric!r} is not a metric of training ({known})")
        if c.against == TEACHER:
            raise ConfigError(f"{key}.against", "the AR teacher has no conversion run to read training from")
        return
    evals = resolved.studies[study].evals
    if name not in evals:
        raise ConfigError(
            f"{key}.benchmark", f"{name!r} is not one of the evals of studies.{study} ({', '.join(evals)})"
        )
    bench, kind = resolved.benchmarks[name].settings, resolved.benchmarks[name].kind
    if metric == HEADLINE:
        if not kind.scored:
            raise ConfigError(f"{key}.benchmark", f"{name} (kind {bench['kind']}) has no score in [0, 1] to average")
        return
    if metric in kind.rates and c.decoding == "best":
        raise ConfigError(
            f"{key}.decoding",
            f"{metric} of the best row is the fastest setting whatever its accuracy: read lowest_threshold or "
            "default_threshold",
        )
    if metric not in kind.metrics:
        raise ConfigError(
            f"{key}.metric",
            f"{metric!r} is not a metric of benchmark {name} (kind {bench['kind']}: {', '.join(kind.metrics)})",
        )
    k = int(metric.rsplit("@", 1)[1]) if "_pass@" in metric else 1
    if k > bench.get("n_samples", 1):
        raise ConfigError(
            f"{key}.metric",
            f"{metric} needs at least {k} samples per task; "
            f"eval.benchmarks.{name}.n_samples is {bench.get('n_samples', 1)}",
        )
    if metric.startswith("plus_") and bench.get("format") != "evalplus":
        raise ConfigError(
            f"{key}.metric", f"{metric} needs the evalplus format; eval.benchmarks.{name} is {bench.get('format')}"
        )
    if c.decoding != "best" and not kind.rows:
        raise ConfigError(
            f"{key}.decoding",
            f"benchmark {name} (kind {bench['kind']}) writes one result, not one row per decoding setting",
        )
    if c.decoding == "default_threshold" and bench["threshold"] not in bench.get("thresholds", []):
        raise ConfigError(
            f"{key}.decoding",
            f"benchmark {name} sweeps thresholds {bench.get('thresholds')}, not its own {bench['threshold']}",
        )
