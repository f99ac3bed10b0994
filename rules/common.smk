# Load the preset, validate it against the schema, check cross-key constraints; job lists and the
# results layout come from ar2dlm.pipeline (one home for each), the input functions live here.
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version

# Every job runs the package of the checkout that holds this Snakefile, whatever copy is installed.
sys.path.insert(0, workflow.basedir)
from ar2dlm.pipeline.config import use_checkout

try:
    use_checkout(workflow.basedir)
except RuntimeError as exc:
    raise WorkflowError(str(exc)) from None

from ar2dlm.pipeline import layout
from ar2dlm.pipeline.checks import checked_config, emulated_bf16_warning, sandbox_problem
from ar2dlm.pipeline.config import ConfigError, read_config_file
from ar2dlm.pipeline.jobs import armap_domains, direct_objectives, direct_settings, token_rows_source
from ar2dlm.core.hub import MissingAssetError, is_cached, missing_message, require_token
from ar2dlm.pipeline.assets import assets_for, hub_assets
from ar2dlm.plan.launch import launcher, plan_cluster, tokenize_resources
from ar2dlm.plan.tokenize import plan_tokenize
from ar2dlm.reporting.armap import armap_report_inputs
from ar2dlm.reporting.captions import study_figure_caption, study_table_caption
from ar2dlm.reporting.claims import claim_inputs
from ar2dlm.reporting.tables import study_inputs
from ar2dlm.training.tracking import export as export_tracking

min_version("9.0")

try:  # the schema takes its method names and loss terms from the registry (and the config's `methods:`)
    for _file in workflow.configfiles:  # Snakemake keeps the last of a key set twice: refused here
        read_config_file(_file)
    # the config resolved once into typed objects (runs, studies, benchmarks, claims, job lists)
    RESOLVED = checked_config(config, Path(workflow.basedir) / "config")
except ConfigError as exc:
    raise WorkflowError(f"invalid config: {exc}") from None
config.clear()
config.update(RESOLVED.config)
if _warning := emulated_bf16_warning(config):
    print(f"Warning: {_warning}", file=sys.stderr)
# Generated code runs in a bubblewrap sandbox: this machine learns it cannot start one before any job
# (a dry run is warned; a job on a compute node checks its own node before its model loads).
# (workflow.dryrun is not yet set while the Snakefile is read: the command line says, -n or -np)
_DRY_RUN = any(a in ("--dry-run", "--dryrun") or re.fullmatch(r"-[a-zA-Z]*n[a-zA-Z]*", a) for a in sys.argv)
if not workflow.remote_exec and (_no_sandbox := sandbox_problem(config)):
    if not _DRY_RUN:
        raise WorkflowError(f"prerequisite missing: {_no_sandbox}")
    print(f"Warning (dry run): {_no_sandbox}", file=sys.stderr)
# A report gathers what a run made: before any table or figure exists it would be empty, after a screen of
# "missing metadata" lines.
_REPORTED = ("tables/**/*.md", "**/*.png", "*.md")
if any(a == "--report" or a.startswith("--report=") for a in sys.argv) and not any(
    next(Path(layout.RESULTS).glob(g), None) for g in _REPORTED
):
    raise WorkflowError(
        f"snakemake --report gathers a run's tables, figures and claims, and {layout.RESULTS}/ holds none yet: "
        "run `snakemake all_tables --cores 2` (or one table or figure) first"
    )
# Every planned job's launch for config["cluster"] (python -m ar2dlm.plan prints them); none without one.
CLUSTER = plan_cluster(RESOLVED)
if _unfit := CLUSTER.unfit():
    raise WorkflowError(
        "jobs that do not fit the config's cluster (python -m ar2dlm.plan prints every estimate):\n  "
        + "\n  ".join(_unfit)
    )
# Compute jobs never download: `snakemake prefetch` (a local rule) fills the hub cache where the network is.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
HUB_ASSETS = hub_assets(config)
export_tracking({**config["tracking"], "directory": layout.tracking_dir(config["tracking"]["backend"])})

MODELS = list(config["models"])
RUNS = list(config["runs"])
CONVERSIONS = RESOLVED.conversions  # every run of the grid (model, run, seed)
EVALS, TEACHER_EVALS = RESOLVED.evals  # what the studies evaluate
BENCHMARKS = list(config["eval"]["benchmarks"])
STUDIES = list(config["studies"])
ARMAP = RESOLVED.armap  # AR-MAP's DPO, spectra, gamma searches, baselines and their evaluations
PREF_DOMAINS = list(config["data"]["preferences"]["domains"])
FIGURES = {layout.figure_stem(s): s for s, spec in config["studies"].items() if "figure" in spec}


wildcard_constraints:
    model="|".join(MODELS),
    run="|".join(RUNS),
    seed=r"\d+",
    step=r"\d+",
    source=r"subset|stream|promptset_\w+",
    selection=r"documents|document_rows|prompts_\w+",
    seq_len=r"\d+",
    shard=r"\d+",
    shards=r"\d+",
    benchmark="|".join(BENCHMARKS),
    study="|".join(re.escape(s) for s in STUDIES),
    figpath="|".join(re.escape(layout.figure_stem(s)) for s in STUDIES),
    pset="|".join(config["data"]["prompt_sets"]) or "no_prompt_sets",
    domain="|".join(PREF_DOMAINS),
    pdomain="|".join(armap_domains(config["armap"])),
    merge="|".join(config["armap"]["merges"]),
    objective="|".join(direct_objectives(config["armap"])),


def corpus_outputs():
    out = {"manifest": layout.corpus_file("manifest"), "subset": layout.corpus_file("subset")}
    if config["data"]["corpus"]["materialize_stream"]:
        out["stream"] = layout.corpus_file("stream")
    return out


def preference_inputs(wildcards):
    """Synthetic preference domains are built from the suite of the same name."""
    spec = config["data"]["preferences"]["domains"][wildcards.domain]
    if spec["source"] != "synthetic":
        return {}
    return {"train": layout.suite_file(wildcards.domain, "train"), "eval": layout.suite_file(wildcards.domain, "eval")}


_CACHED = {}


def require_cached(key):
    """Fail the DAG build if the hub cache lacks an asset the config key ``key`` uses, naming every
    asset it lacks (each checked once). A dry run, which runs nothing, shows its plan and warns
    once instead: a plan is read before `snakemake prefetch` has filled the cache."""

    def cached(a):
        return _CACHED.setdefault(a, is_cached(a))

    if all(cached(a) for a in assets_for(HUB_ASSETS, key)):
        return
    message = missing_message([a for a in HUB_ASSETS if not cached(a)])  # every missing asset at once
    if not workflow.dryrun:
        raise WorkflowError(message)
    if not _CACHED.get("warned"):
        _CACHED["warned"] = True
        print(f"Warning (dry run): {message}", file=sys.stderr)


def hub_ready(key):
    """An input function adding no file: ``require_cached`` of the config key ``key`` (or
    ``key(wildcards)``; None: the job reads nothing from the hub)."""

    def check(wildcards):
        k = key(wildcards) if callable(key) else key
        if k:
            require_cached(k)
        return []

    return check


def hub_ready_to_fetch(wildcards):
    """prefetch's input function: fails before any download when a gated data set needs a token."""
    try:
        require_token(HUB_ASSETS)
    except MissingAssetError as exc:
        raise WorkflowError(str(exc)) from None
    return []


def teacher_inputs(wildcards):
    """A teacher pretrained here reads the corpus stream; a pretrained one only the tokenizer rule's output."""
    require_cached(f"models.{wildcards.model}")
    inputs = {"tokenizer": layout.tokenizer_dir()}
    if config["models"][wildcards.model]["source"] == "pretrain":
        inputs["corpus"] = layout.corpus_file("stream")
    return inputs


def benchmark_inputs(wildcards):
    """The data a benchmark reads (its kind says which)."""
    require_cached(f"eval.benchmarks.{wildcards.benchmark}")
    bench = RESOLVED.benchmarks[wildcards.benchmark]
    return layout.benchmark_inputs(wildcards.benchmark, bench.kind.reads(bench.settings))


def preference_domains(wildcards):
    """A preference domain, or every searched domain for 'all'."""
    return config["armap"]["domains"] if wildcards.pdomain == "all" else [wildcards.pdomain]


def preference_files(split):
    """The preference pairs of ``preference_domains``, in their order."""

    def inputs(wildcards):
        return [layout.preference_file(d, split) for d in preference_domains(wildcards)]

    return inputs


def eval_outputs():
    return [j.path for j in EVALS] + [j.path for j in TEACHER_EVALS]


def table_outputs():
    out = [layout.study_table(s, fmt) for s in STUDIES for fmt in layout.TABLE_FORMATS]
    out += [layout.study_figure(stem, fmt) for stem in FIGURES for fmt in layout.FIGURE_FORMATS]
    out += [
        layout.armap_table("main", "md"),
        layout.armap_figure("gamma", "pdf"),
        layout.claims_file("md"),
        layout.claims_file("csv"),
    ]
    return out


# The interpreter a job's shell command starts: under --use-conda the job's environment is activated,
# so its python; otherwise the one running Snakemake (a SLURM job's Snakemake is the submitting one's).
PYTHON = "python" if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method else sys.executable


def token_rows_plan(wildcards):
    """How a token_rows folder is tokenised: shard jobs, worker processes, memory, runtime."""
    return plan_tokenize(config, wildcards.source, wildcards.selection, int(wildcards.seq_len))


def token_rows_shards(wildcards):
    """The shard folders a token_rows job merges; none when one job tokenises the source alone."""
    plan = token_rows_plan(wildcards)
    if plan.shards == 1:
        return []
    return [
        layout.token_rows_shard_dir(wildcards.source, wildcards.selection, wildcards.seq_len, k, plan.shards)
        for k in range(plan.shards)
    ]


def token_rows_threads(wildcards):
    """The planned worker processes of a job that tokenises; one for a merge of shards."""
    plan = token_rows_plan(wildcards)
    return plan.workers if plan.shards == 1 or "shard" in wildcards.keys() else 1


def token_rows_resources():
    """SLURM memory and runtime of planned tokenising jobs (the planner's; a merge of shards its own);
    none without a ``cluster`` (the profile's)."""
    if not config.get("cluster"):
        return {}

    def resources(wc):
        plan = token_rows_plan(wc)
        return tokenize_resources(plan, plan.shards == 1 or "shard" in wc.keys())

    return {"mem_mb": lambda wc: resources(wc)["mem_mb"], "runtime": lambda wc: resources(wc)["runtime"]}
