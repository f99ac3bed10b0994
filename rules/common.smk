# Load the preset, validate it against the schema, check cross-key constraints, path helpers.
import json
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from ar2dlm.config import ConfigError, check_config, describe_schema_error, merge_preset
from ar2dlm.armap.report import armap_report_inputs
from ar2dlm.claims import claim_inputs
from ar2dlm.evaluation.suite import benchmark_settings
from ar2dlm.tables import study_inputs
from ar2dlm.runs import armap_domains, armap_jobs, conversion_jobs, eval_jobs, resolve_run

min_version("9.0")

_merged = merge_preset(config, Path(workflow.basedir) / "config")
config.clear()
config.update(_merged)
try:
    validate(config, "../config/schema.yaml", set_default=False)
except WorkflowError as exc:
    raise WorkflowError(describe_schema_error(exc)) from None
try:
    check_config(config)
except ConfigError as exc:
    raise WorkflowError(f"invalid config: {exc}") from None

RESULTS = "results"
MODELS = list(config["models"])
RUNS = list(config["runs"])
CONVERSIONS = conversion_jobs(config)  # (model, run, seed) of every run of the grid
EVALS, TEACHER_EVALS = eval_jobs(config)  # what the studies evaluate
BENCHMARKS = list(config["eval"]["benchmarks"])
STUDIES = list(config["studies"])
ARMAP = armap_jobs(config)  # AR-MAP's DPO, spectra, gamma searches, baselines and their evaluations
PREF_DOMAINS = list(config["data"]["preferences"]["domains"])


def figure_stem(study):
    """figures/<study>; the ablation studies' figures lie under results/ablations/."""
    return study if study.startswith("ablations/") else f"figures/{study}"


FIGURES = {figure_stem(s): s for s, spec in config["studies"].items() if "figure" in spec}


def data_path(*parts):
    return os.path.join(RESULTS, "data", *parts)


def teacher_dir(model="{model}"):
    return f"{RESULTS}/models/{model}/teacher"


def teacher_check_path(model="{model}"):
    return f"{RESULTS}/eval/teacher_check/{model}.json"


def eval_path(benchmark="{benchmark}", model="{model}", run="{run}", seed="{seed}", step="{step}"):
    """One evaluation JSON per (benchmark, model, run, seed, checkpoint step); the AR teacher's is
    ``teacher.json``. Code and maths evaluations keep their samples beside it (``.samples.jsonl``)."""
    if run == "teacher":
        return f"{RESULTS}/eval/{benchmark}/{model}/teacher.json"
    return f"{RESULTS}/eval/{benchmark}/{model}/{run}/seed{seed}/step_{step}.json"


def conversion_dir(model="{model}", run="{run}", seed="{seed}"):
    return f"{RESULTS}/models/{model}/{run}/seed{seed}"


def conversion_manifest(model="{model}", run="{run}", seed="{seed}"):
    """The declared output of a conversion; its step_<k>/ checkpoints lie beside it."""
    return os.path.join(conversion_dir(model, run, seed), "train.json")


def log_path(name):
    return f"{RESULTS}/logs/{name}.log"


def bench_path(name):
    """Snakemake's per-job benchmark record (wall time, memory) of a rule, named like its log."""
    return f"{RESULTS}/benchmarks/{name}.tsv"


def corpus_outputs():
    out = {"manifest": data_path("corpus", "manifest.json"), "subset": data_path("corpus", "subset.jsonl")}
    if config["data"]["corpus"]["materialize_stream"]:
        out["stream"] = data_path("corpus", "stream.jsonl")
    return out


def run_settings(name):
    """What a run trains with: its resolved settings without the job selection (models, seeds),
    so adding a model or a seed elsewhere does not retrain existing runs."""
    return {k: v for k, v in resolve_run(config, name).items() if k not in ("models", "seeds")}


def conversion_corpus(wildcards):
    """The run's training data: a prompt set for distillation from one, else its corpus cut (a
    stream that is not written out is read through its manifest)."""
    run = resolve_run(config, wildcards.run)
    if run["distill"] is not None and run["distill"]["prompts"] in config["data"]["prompt_sets"]:
        return data_path("prompts", f"{run['distill']['prompts']}.jsonl")
    cut = run["data"]
    if cut == "stream" and not config["data"]["corpus"]["materialize_stream"]:
        return data_path("corpus", "manifest.json")
    return data_path("corpus", f"{cut}.jsonl")


wildcard_constraints:
    model="|".join(MODELS),
    run="|".join(RUNS),
    seed=r"\d+",
    step=r"\d+",
    benchmark="|".join(BENCHMARKS),
    study="|".join(re.escape(s) for s in STUDIES),
    figpath="|".join(re.escape(figure_stem(s)) for s in STUDIES),
    pset="|".join(config["data"]["prompt_sets"]) or "no_prompt_sets",
    domain="|".join(PREF_DOMAINS),


def preference_inputs(wildcards):
    """Synthetic preference domains are built from the suite of the same name."""
    spec = config["data"]["preferences"]["domains"][wildcards.domain]
    if spec["source"] != "synthetic":
        return {}
    return {"train": data_path(wildcards.domain, "train.jsonl"), "eval": data_path(wildcards.domain, "eval.jsonl")}


def teacher_inputs(wildcards):
    """A teacher pretrained here reads the corpus stream; a pretrained one only the tokenizer rule's output."""
    inputs = {"tokenizer": data_path("tokenizer")}
    if config["models"][wildcards.model]["source"] == "pretrain":
        inputs["corpus"] = data_path("corpus", "stream.jsonl")
    return inputs


def benchmark_inputs(wildcards):
    """The data a benchmark reads: its problems file (code), or the held-out suites."""
    spec = benchmark_settings(config, wildcards.benchmark)
    kind = spec["kind"]
    if kind in ("code", "throughput"):
        return {"problems": data_path("benchmarks", f"{wildcards.benchmark}.jsonl")}
    if kind == "math" or (kind == "harness" and spec["local"]):
        return {"math": data_path("math", "eval.jsonl")}
    if kind == "embeddings" and "docstring_retrieval" in spec["tasks"]:
        return {"code": data_path("code", "eval.jsonl")}
    if kind == "likelihood":
        return {"code": data_path("code", "eval.jsonl"), "math": data_path("math", "eval.jsonl")}
    return {}


def eval_outputs():
    return [eval_path(*job) for job in EVALS] + [eval_path(b, m, "teacher") for b, m in TEACHER_EVALS]


def armap_dir(model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}"):
    return f"{RESULTS}/armap/{model}/{run}/seed{seed}/{pdomain}"


def teacher_dpo_dir(model="{model}", pdomain="{pdomain}"):
    return f"{RESULTS}/models/{model}/teacher_dpo/{pdomain}"


def derived_dir(kind, model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}", merge="{merge}"):
    """A model AR-MAP derives from the conversion DLM (model, run, seed)."""
    leaf = f"armap/{pdomain}_{merge}" if kind == "armap" else f"dlm_dpo/{pdomain}"
    return f"{conversion_dir(model, run, seed)}/{leaf}"


def preference_files(split):
    """The preference pairs of a domain, or of every searched domain for 'all'."""
    def inputs(wildcards):
        doms = config["armap"]["domains"] if wildcards.pdomain == "all" else [wildcards.pdomain]
        return [data_path("preferences", d, f"{split}.jsonl") for d in doms]
    return inputs


wildcard_constraints:
    pdomain="|".join(armap_domains(config)),
    merge="|".join(config["armap"]["merges"]),


def armap_outputs():
    j = ARMAP
    out = [teacher_dpo_dir(m, d) for m, d in j["dpo"]]
    out += [f"{armap_dir(m, r, s, d)}/spectra.csv" for m, r, s, d in j["spectra"]]
    out += [f"{armap_dir(m, r, s, d)}/{g}/gamma.json" for m, r, s, d, g in j["search"]]
    out += [derived_dir("dlm_dpo", m, r, s, d) for m, r, s, d in j["dlm_dpo"]]
    for e in j["evals"]:
        if len(e) == 3:
            out.append(f"{RESULTS}/eval/{e[0]}/{e[1]}/{e[2]}.json")
        else:
            out.append(f"{RESULTS}/eval/{e[0]}/{e[1]}/{e[2]}/seed{e[3]}/{e[4]}.json")
    return out


def study_config(study):
    """What a study's table and figure read from the config (so other studies' edits rerun nothing)."""
    spec = config["studies"][study]
    runs = {r: config["runs"][r] for r in spec["runs"]}
    return {"preset": config["preset"], "seed": config["seed"], "studies": {study: spec}, "runs": runs,
            "training": config["training"], "models": config["models"],
            "eval": {"decoding": config["eval"]["decoding"],
                     "benchmarks": {e: config["eval"]["benchmarks"][e] for e in spec["evals"]}}}




def table_outputs():
    out = [f"{RESULTS}/tables/{s}.{ext}" for s in STUDIES for ext in ("md", "csv", "tex")]
    out += [f"{RESULTS}/{stem}.{ext}" for stem in FIGURES for ext in ("pdf", "png")]
    out += [f"{RESULTS}/tables/armap/main.md", f"{RESULTS}/figures/armap/gamma.pdf", f"{RESULTS}/claims.md",
            f"{RESULTS}/claims.csv"]
    return out


def launcher(resources):
    """torchrun with one process per GPU when the job has several, else this Python."""
    gpus = int(resources.get("gpu", 0) or 0)
    if gpus > 1:
        return f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node={gpus}"
    return sys.executable
