"""Conversion runs: a run names a method, whose defaults it starts from, and may compose further
objectives (alignment, distillation) and options. ``resolve_run`` gives the complete settings."""

from __future__ import annotations

import copy
from pathlib import Path

from .config import ConfigError, deep_merge
from .provenance import read_json

_BASE = {"init": "ar", "attention": "bidirectional", "block_size": None, "shift": True, "masking": "uniform",
         "positional_beta": 0.0, "loss_weight": "inverse_t", "data": "subset", "align": None, "freeze": [],
         "distill": None}
ALIGN_DEFAULTS = {"lambda": 10.0, "metric": "cos", "layers": "all"}
SYNTHETIC_PROMPTS = {"all": {"code", "math"}, "code": {"code"}, "math": {"math"}}  # corpus document sources
DISTILL_DEFAULTS = {"on_policy": True, "divergence": "forward_kl", "top_k": None, "threshold": 0.9, "prompts": "all",
                    "curriculum": None, "rollout_length": None}

# Method defaults follow the papers' public code where it exists (PAPERS.md):
# REPR-ALIGN (Open-dLLM): shift on, bidirectional, alignment lambda 10, cosine, all layers.
# Efficient-DLM (closest public design: Fast-dLLM v2): block attention with clean context,
#   position-dependent masking, no shift, block 32.
# OPDLM (divelab/OPDLM): block 4, threshold 0.9, forward KL, no shift, on-policy.
METHOD_DEFAULTS = {
    "mdlm": {},
    "repr_align": {"align": ALIGN_DEFAULTS},
    "efficient_dlm": {"attention": "block", "block_size": 32, "shift": False, "masking": "positional",
                      "positional_beta": 2.0},
    "opdlm": {"attention": "block", "block_size": 4, "shift": False, "distill": DISTILL_DEFAULTS},
}


def resolve_run(config: dict, name: str) -> dict:
    """Method defaults, then the run's own keys, then training = preset training + run overrides."""
    if name not in config["runs"]:
        raise ConfigError(f"runs.{name}", f"no such run (known: {', '.join(config['runs'])})")
    run = copy.deepcopy(config["runs"][name])
    out = deep_merge(deep_merge(_BASE, METHOD_DEFAULTS[run["method"]]), run)
    if run.get("align") is not None:
        out["align"] = deep_merge(ALIGN_DEFAULTS, run["align"])
    if run.get("distill") is not None:
        out["distill"] = deep_merge(DISTILL_DEFAULTS, run["distill"])
    out["training"] = deep_merge(config["training"], run.get("training", {}))
    out["models"] = run.get("models", list(config["models"]))
    out["seeds"] = run.get("seeds", [config["seed"]])
    out["name"] = name
    return out


def check_runs(config: dict) -> None:
    """Cross-key checks of every run and study, with the key named."""
    models = config["models"]
    for name in config["runs"]:
        key = f"runs.{name}"
        if name == "teacher":
            raise ConfigError(key, "'teacher' names the AR teacher's folder; give the run another name")
        run = resolve_run(config, name)
        for m in run["models"]:
            if m not in models:
                raise ConfigError(f"{key}.models", f"{m!r} is not a key of models ({', '.join(models)})")
        if run["method"] == "repr_align" and run["align"] is None:
            raise ConfigError(f"{key}.align", "method repr_align needs an alignment term")
        if run["method"] == "opdlm" and run["distill"] is None:
            raise ConfigError(f"{key}.distill", "method opdlm needs a distillation term")
        needs_block = run["attention"] == "block" or run["masking"] == "positional"
        if needs_block and run["block_size"] is None:
            raise ConfigError(f"{key}.block_size", "block attention and position-dependent masking need a block size")
        bs, seq = run["block_size"], run["training"]["seq_len"]
        if needs_block and seq % bs:
            raise ConfigError(f"{key}.block_size", f"block size {bs} does not divide the sequence length {seq}")
        if run["align"] is not None and isinstance(run["align"]["layers"], list):
            for m in run["models"]:
                arch = models[m].get("arch")
                if arch and max(run["align"]["layers"]) > arch["num_hidden_layers"]:
                    raise ConfigError(f"{key}.align.layers", f"layer {max(run['align']['layers'])} does not exist in "
                                      f"{m} (hidden states 0..{arch['num_hidden_layers']})")
        d = run["distill"]
        if d is not None:
            sets = config["data"]["prompt_sets"]
            if d["prompts"] in SYNTHETIC_PROMPTS:
                if config["data"]["corpus"]["source"] != "synthetic":
                    raise ConfigError(f"{key}.distill.prompts", f"{d['prompts']!r} selects prompts of the synthetic "
                                      "corpus; with a hub corpus name a key of data.prompt_sets")
            elif d["prompts"] not in sets:
                raise ConfigError(f"{key}.distill.prompts", f"{d['prompts']!r} is neither all, code, math nor a key of "
                                  f"data.prompt_sets ({', '.join(sets) or 'none defined'})")
            elif not d["on_policy"] and not sets[d["prompts"]].get("completion_field"):
                raise ConfigError(f"{key}.distill.on_policy", f"off-policy distillation needs clean completions; "
                                  f"data.prompt_sets.{d['prompts']} has no completion_field")
            lengths = [d["rollout_length"]] if d["rollout_length"] else []
            if d["curriculum"]:
                c = d["curriculum"]
                if c["min_length"] > c["max_length"]:
                    raise ConfigError(f"{key}.distill.curriculum.min_length", f"{c['min_length']} exceeds max_length "
                                      f"{c['max_length']}")
                lengths += [c["min_length"], c["max_length"]]
            if not lengths:
                raise ConfigError(f"{key}.distill.rollout_length", "on- and off-policy distillation need a rollout "
                                  "length (or a curriculum)")
            for length in lengths:
                if run["block_size"] and length % run["block_size"]:
                    raise ConfigError(f"{key}.distill", f"block size {run['block_size']} does not divide the rollout "
                                      f"length {length}")
    for study, spec in config["studies"].items():
        for r in spec["runs"]:
            if r not in config["runs"]:
                raise ConfigError(f"studies.{study}.runs", f"{r!r} is not a key of runs")
        for r in spec.get("run_seeds", {}):
            if r not in spec["runs"]:
                raise ConfigError(f"studies.{study}.run_seeds", f"{r!r} is not one of the study's runs ({', '.join(spec['runs'])})")
        for m in spec.get("models", []):
            if m not in models:
                raise ConfigError(f"studies.{study}.models", f"{m!r} is not a key of models")
    check_evals(config)
    check_armap(config)


DECODED_KINDS = ("code", "math", "throughput")
LOCAL_HARNESS_TASKS = ("arith_choice",)  # tasks kept in ar2dlm/evaluation/tasks, built from the maths suite


def check_evals(config: dict) -> None:
    """Every benchmark a study names exists and fits its data and the runs it evaluates."""
    benches, data = config["eval"]["benchmarks"], config["data"]
    for name, b in benches.items():
        key = f"eval.benchmarks.{name}"
        suite = {"code": "code_suite", "throughput": "code_suite", "math": "math_suite"}.get(b["kind"])
        if suite and b.get("source", "suite") == "suite" and b.get("limit") and b["limit"] > data[suite]["n_eval"]:
            raise ConfigError(f"{key}.limit", f"{b['limit']} tasks asked, larger than their source "
                              f"data.{suite}.n_eval ({data[suite]['n_eval']})")
        if b["kind"] == "harness" and b["local"] and b["task"] not in LOCAL_HARNESS_TASKS:
            raise ConfigError(f"{key}.task", f"no local task {b['task']!r} (local tasks: {', '.join(LOCAL_HARNESS_TASKS)})")
        if b["kind"] == "code" and b["n_samples"] > 1 and b["temperature"] == 0:
            raise ConfigError(f"{key}.temperature", f"{b['n_samples']} samples per task need a temperature above 0")
    for study, spec in config["studies"].items():
        for e in spec["evals"]:
            if e not in benches:
                raise ConfigError(f"studies.{study}.evals", f"{e!r} is not a key of eval.benchmarks "
                                  f"({', '.join(benches)})")
            b = {**config["eval"]["decoding"], **benches[e]}
            if b["kind"] not in DECODED_KINDS:
                continue
            blocks = [resolve_run(config, r)["block_size"] for r in spec["runs"]
                      if resolve_run(config, r)["attention"] == "block"]
            blocks += b.get("block_sizes", []) if b["kind"] == "throughput" else [b["block_size"]]
            for bs in blocks:
                if b["max_new_tokens"] % bs:
                    raise ConfigError(f"eval.benchmarks.{e}.max_new_tokens", f"block size {bs} (studies.{study}) does "
                                      f"not divide the generation length {b['max_new_tokens']}")


def study_seeds(config: dict, spec: dict, run: str) -> list[int]:
    """Seeds of one run in a study: its entry in the study's run_seeds, else the study's seeds, else the run's."""
    return spec.get("run_seeds", {}).get(run, spec.get("seeds", resolve_run(config, run)["seeds"]))


def conversion_jobs(config: dict) -> list[tuple[str, str, int]]:
    """Every (model, run, seed) to train: each run on its models with its seeds, plus the seeds
    and models each study asks of it."""
    jobs = set()
    for name in config["runs"]:
        run = resolve_run(config, name)
        jobs.update((m, name, s) for m in run["models"] for s in run["seeds"])
    for spec in config["studies"].values():
        for name in spec["runs"]:
            run = resolve_run(config, name)
            models = [m for m in spec.get("models", run["models"]) if m in run["models"]]
            jobs.update((m, name, s) for m in models for s in study_seeds(config, spec, name))
    return sorted(jobs)


def final_checkpoint(manifest) -> Path:
    """The last checkpoint of a finished run, from its manifest (train.json)."""
    return Path(manifest).parent / f"step_{read_json(manifest)['steps']}"


def checkpoint_steps_of(run: dict) -> list[int]:
    """Steps at which a run writes a checkpoint (every K steps and the last)."""
    t = run["training"]
    return sorted({*range(t["checkpoint_every"], t["steps"] + 1, t["checkpoint_every"]), t["steps"]})


def eval_jobs(config: dict) -> tuple[list[tuple], list[tuple]]:
    """What the studies evaluate: (benchmark, model, run, seed, step) of conversion checkpoints,
    and (benchmark, model) of the AR teachers, on every benchmark a study uses."""
    conversions, teachers = set(), set()
    for spec in config["studies"].values():
        for name in spec["runs"]:
            run = resolve_run(config, name)
            models = [m for m in spec.get("models", run["models"]) if m in run["models"]]
            steps = checkpoint_steps_of(run) if spec.get("checkpoints") == "all" else [run["training"]["steps"]]
            conversions.update((e, m, name, s, k) for e in spec["evals"] for m in models
                               for s in study_seeds(config, spec, name) for k in steps)
            teachers.update((e, m) for e in spec["evals"] for m in models)
    return sorted(conversions), sorted(teachers)


def armap_domains(config: dict) -> list[str]:
    """Preference domains of AR-MAP's DPO: each searched domain, and all of them together."""
    return list(config["armap"]["domains"]) + ["all"]


def check_armap(config: dict) -> None:
    a, prefs = config["armap"], config["data"]["preferences"]
    for r in a["runs"]:
        if r not in config["runs"]:
            raise ConfigError("armap.runs", f"{r!r} is not a key of runs")
        if resolve_run(config, r)["attention"] == "causal":
            raise ConfigError("armap.runs", f"{r!r} trains a causal model; AR-MAP transfers to DLMs")
    for d in a["domains"]:
        if d not in prefs["domains"]:
            raise ConfigError("armap.domains", f"{d!r} is not a key of data.preferences.domains "
                              f"({', '.join(prefs['domains'])})")
    for d, benches in a["evals"].items():
        if d not in armap_domains(config):
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
        if m in a["eval_merges"] or m == "task_arithmetic":
            raise ConfigError(f"armap.merge_seeds.{m}", "the evaluated merges and task arithmetic (the claims' "
                              "merge) are searched on every seed of armap.seeds")
        if not set(seeds) <= set(a["seeds"]):
            raise ConfigError(f"armap.merge_seeds.{m}", f"{sorted(set(seeds) - set(a['seeds']))} not in armap.seeds {a['seeds']}")
    for part in ("dpo", "gamma", "dlm_dpo"):
        n = a[part]["eval_pairs"]
        for d in a["domains"]:
            have = prefs["domains"][d].get("n_eval", prefs["n_eval"])
            if n is not None and n > have:
                raise ConfigError(f"armap.{part}.eval_pairs", f"{n} pairs asked, larger than the {have} held-out "
                                  f"{d} pairs (data.preferences)")


def search_seeds(config: dict, merge: str) -> list[int]:
    """Seeds on which one merge's gamma is searched: its armap.merge_seeds entry, else armap.seeds."""
    a = config["armap"]
    return a.get("merge_seeds", {}).get(merge, a["seeds"])


def armap_dlms(config: dict) -> list[tuple[str, str, int]]:
    """The DLMs that receive AR-MAP's vector: (model, run, seed) for each of armap.runs and armap.seeds."""
    a = config["armap"]
    return [(m, r, s) for r in a["runs"] for m in resolve_run(config, r)["models"] for s in a["seeds"]]


def armap_jobs(config: dict) -> dict:
    """AR-MAP's outputs: DPO'd teachers, and per DLM (model, run, seed) and domain the spectra,
    gamma searches (one per merge), DLM DPO baselines, and the evaluations of the models they write."""
    a = config["armap"]
    dlms = armap_dlms(config)
    models = sorted({m for m, _, _ in dlms})
    doms = armap_domains(config)
    jobs = {
        "dpo": [(m, d) for m in models for d in doms],
        "spectra": [(m, r, s, d) for m, r, s in dlms for d in a["domains"]],
        "search": [(m, r, s, d, g) for m, r, s in dlms for d in a["domains"] for g in a["merges"]
                   if s in search_seeds(config, g)],
        "dlm_dpo": [(m, r, s, d) for m, r, s in dlms for d in a["domains"]],
        "dlms": dlms,
    }
    evals = []
    for d, benches in a["evals"].items():
        for b in benches:
            evals += [(b, m, "teacher_dpo_" + d) for m in models]
            if d in a["domains"]:
                evals += [(b, m, r, s, f"armap_{d}_{g}") for m, r, s in dlms for g in a["eval_merges"]]
                evals += [(b, m, r, s, f"dlm_dpo_{d}") for m, r, s in dlms]
    jobs["evals"] = evals
    return jobs
