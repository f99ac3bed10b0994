"""The results folder: every path a rule writes or a table, figure, claim or report reads.

Paths are relative to the working directory, as Snakemake's are. Called with no arguments, a
function returns the pattern with Snakemake wildcards (``{model}``, ``{run}``, ...); called with
values, the concrete path. Rules and readers use the same function, so an output and its reader
cannot drift apart. Layout (``results/``):

    data/{code,math}/{train,eval}.jsonl, data/tokenizer/, data/corpus/{subset,stream}.jsonl + manifest.json,
    data/preferences/<domain>/{train,eval}.jsonl, data/prompts/<set>.jsonl, data/benchmarks/<benchmark>.jsonl
    models/<model>/teacher/, models/<model>/teacher_dpo/<domain>/
    models/<model>/<run>/seed<s>/train.json (+ step_<k>/ checkpoints, log.jsonl)
    models/<model>/<run>/seed<s>/armap/<domain>_<merge>/, .../dlm_<objective>/<domain>/ (objective: dpo, simpo)
    armap/<model>/<run>/seed<s>/<domain>/spectra.csv, shadowing.{pdf,png}, <merge>/gamma.json
    eval/<benchmark>/<model>/teacher.json, teacher_dpo_<domain>.json
    eval/<benchmark>/<model>/<run>/seed<s>/step_<k>.json, armap_<domain>_<merge>.json, dlm_<objective>_<domain>.json
    eval/teacher_check/<model>.json, eval/summary.{csv,md}, summary.{md,json}
    tables/<study>.{md,csv,tex}, figures/<study>.{pdf,png} (ablations: ablations/<name>.{pdf,png})
    tables/armap/{main,merges}.{md,csv,tex}, figures/armap/{gamma,shadowing}.{pdf,png}, claims.{md,csv}
    logs/<stage>/<job>.log, benchmarks/<stage>/<job>.tsv, bench/{decode,train}.json
"""

from __future__ import annotations

import os
from pathlib import Path

# A run's step_<k>/ checkpoints inside its folder have one home, ar2dlm.core.models (checkpoint_dir,
# final_checkpoint): the trainer and AR-MAP, below this layer, find them too.

RESULTS = "results"
TABLE_FORMATS = ("md", "csv", "tex")
FIGURE_FORMATS = ("pdf", "png")


def _r(*parts) -> str:
    return os.path.join(RESULTS, *map(str, parts))


# --- data ---------------------------------------------------------------------------------------


def data_path(*parts) -> str:
    return _r("data", *parts)


def suite_file(domain: str, split: str) -> str:
    """A synthetic suite (code or math), train or held-out eval."""
    return data_path(domain, f"{split}.jsonl")


def tokenizer_dir() -> str:
    return data_path("tokenizer")


def corpus_file(cut: str) -> str:
    """The corpus subset or stream (``cut``), or its manifest (``manifest``)."""
    return data_path("corpus", "manifest.json" if cut == "manifest" else f"{cut}.jsonl")


def preference_file(domain="{domain}", split="train") -> str:
    return data_path("preferences", domain, f"{split}.jsonl")


def preference_domain(path) -> str:
    """The domain of a preference file (inverse of ``preference_file``)."""
    return Path(path).parent.name


def token_rows_dir(source="{source}", selection="{selection}", seq_len="{seq_len}") -> str:
    """A corpus cut (``subset``, ``stream``) or prompt set (``promptset_<name>``) tokenised into
    rows of ``seq_len`` tokens, the documents of ``selection`` only (data.token_rows)."""
    return data_path("token_rows", str(source), f"{selection}_len{seq_len}")


def token_rows_shard_dir(
    source="{source}", selection="{selection}", seq_len="{seq_len}", shard="{shard}", shards="{shards}"
) -> str:
    """Shard ``shard`` of ``shards`` of a token-rows folder, the part one parallel job tokenises."""
    return data_path("token_rows", str(source), f"{selection}_len{seq_len}.shards", f"{shard}-of-{shards}")


def prompt_set_file(pset="{pset}") -> str:
    return data_path("prompts", f"{pset}.jsonl")


def benchmark_problems(benchmark="{benchmark}") -> str:
    return data_path("benchmarks", f"{benchmark}.jsonl")


def benchmark_inputs(benchmark: str, reads) -> dict[str, str]:
    """The files of the data a benchmark reads (its kind's ``reads``): its problems file, a
    held-out synthetic suite (``code``, ``math``), or a preference domain's held-out split
    (``preferences:<domain>``)."""
    paths = {
        "problems": benchmark_problems(benchmark),
        "code": suite_file("code", "eval"),
        "math": suite_file("math", "eval"),
    }
    paths |= {r: preference_file(r.split(":", 1)[1], "eval") for r in reads if r.startswith("preferences:")}
    unknown = set(reads) - set(paths)
    if unknown:
        raise ValueError(f"benchmark {benchmark} reads {sorted(unknown)}: no such data (known: {', '.join(paths)})")
    return {name: paths[name] for name in reads}


def evalplus_cache() -> str:
    """Where evalplus release files fetched by the code_benchmark rule are kept."""
    return data_path("benchmarks", ".evalplus_cache")


# --- models -------------------------------------------------------------------------------------


def teacher_dir(model="{model}") -> str:
    return _r("models", model, "teacher")


def teacher_loss_log(model="{model}") -> str:
    return _r("logs", "teacher", f"{model}_loss.csv")


def teacher_dpo_dir(model="{model}", pdomain="{pdomain}", seed="{seed}") -> str:
    """The AR teacher DPO'd on ``pdomain`` with ``seed``: each AR-MAP seed has its own preference vector."""
    return _r("models", model, "teacher_dpo", pdomain, f"seed{seed}")


def conversion_dir(model="{model}", run="{run}", seed="{seed}") -> str:
    return _r("models", model, run, f"seed{seed}")


def conversion_manifest(model="{model}", run="{run}", seed="{seed}") -> str:
    """The declared output of a conversion; its step_<k>/ checkpoints lie beside it."""
    return os.path.join(conversion_dir(model, run, seed), "train.json")


def armap_name(pdomain="{pdomain}", merge="{merge}") -> str:
    """A DLM with AR-MAP's preference vector of ``pdomain`` merged by ``merge`` at gamma_hat."""
    return f"armap_{pdomain}_{merge}"


def direct_name(pdomain="{pdomain}", objective="{objective}") -> str:
    """A DLM preference-optimised directly on ``pdomain``'s pairs by ``objective`` (dpo: VRPO's
    estimator; simpo): AR-MAP's baselines."""
    return f"dlm_{objective}_{pdomain}"


def teacher_dpo_name(pdomain="{pdomain}") -> str:
    return f"teacher_dpo_{pdomain}"


def armap_model_dir(model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}", merge="{merge}") -> str:
    return os.path.join(conversion_dir(model, run, seed), "armap", f"{pdomain}_{merge}")


def direct_dir(model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}", objective="{objective}") -> str:
    return os.path.join(conversion_dir(model, run, seed), f"dlm_{objective}", pdomain)


# --- AR-MAP analyses ----------------------------------------------------------------------------


def armap_dir(model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}") -> str:
    return _r("armap", model, run, f"seed{seed}", pdomain)


def spectra_csv(model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}") -> str:
    return os.path.join(armap_dir(model, run, seed, pdomain), "spectra.csv")


def spectra_figure(fmt: str, model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}") -> str:
    return os.path.join(armap_dir(model, run, seed, pdomain), f"shadowing.{fmt}")


def gamma_curve(model="{model}", run="{run}", seed="{seed}", pdomain="{pdomain}", merge="{merge}") -> str:
    return os.path.join(armap_dir(model, run, seed, pdomain), merge, "gamma.json")


# --- evaluations --------------------------------------------------------------------------------


def eval_path(benchmark="{benchmark}", model="{model}", run="{run}", seed="{seed}", step="{step}") -> str:
    """One evaluation JSON per (benchmark, model, run, seed, checkpoint step); the AR teacher's is
    ``teacher.json``. Code and maths evaluations keep their samples beside it (``.samples.jsonl``)."""
    if run == "teacher":
        return _r("eval", benchmark, model, "teacher.json")
    return derived_eval_path(benchmark, model, run, seed, f"step_{step}")


def derived_eval_path(benchmark="{benchmark}", model="{model}", run="{run}", seed="{seed}", name="{name}") -> str:
    """The evaluation of a model derived from a conversion checkpoint (``armap_name``, ``direct_name``)."""
    return _r("eval", benchmark, model, run, f"seed{seed}", f"{name}.json")


def teacher_dpo_eval_path(benchmark="{benchmark}", model="{model}", pdomain="{pdomain}", seed="{seed}") -> str:
    """A DPO'd teacher's evaluation: a model derived from the teacher (run ``teacher``) at ``seed``."""
    return derived_eval_path(benchmark, model, "teacher", seed, teacher_dpo_name(pdomain))


def parse_eval_path(path) -> dict:
    """(benchmark, model, run, seed, variant) of an evaluation JSON: inverse of the three above.
    ``variant`` is the checkpoint (``step_<k>``) or derived model; teachers have no seed or variant."""
    p = Path(path)
    parts = p.parts[p.parts.index("eval") + 1 :]
    if len(parts) == 3:  # <benchmark>/<model>/teacher.json
        return {"benchmark": parts[0], "model": parts[1], "run": p.stem, "seed": None, "variant": None}
    return {"benchmark": parts[0], "model": parts[1], "run": parts[2], "seed": int(parts[3][4:]), "variant": p.stem}


def teacher_check_path(model="{model}") -> str:
    return _r("eval", "teacher_check", f"{model}.json")


def eval_summary(fmt: str) -> str:
    return _r("eval", f"summary.{fmt}")


def run_summary(fmt: str) -> str:
    return _r(f"summary.{fmt}")


# --- tables, figures, claims --------------------------------------------------------------------


def study_table(study="{study}", fmt="md") -> str:
    return _r("tables", f"{study}.{fmt}")


def figure_stem(study: str) -> str:
    """figures/<study>; the ablation studies' figures lie under results/ablations/."""
    return study if study.startswith("ablations/") else f"figures/{study}"


def study_figure(stem="{figpath}", fmt="pdf") -> str:
    """A study's figure, by its ``figure_stem``."""
    return _r(f"{stem}.{fmt}")


def armap_table(name: str, fmt: str) -> str:
    return _r("tables", "armap", f"{name}.{fmt}")


def armap_figure(name: str, fmt: str) -> str:
    return _r("figures", "armap", f"{name}.{fmt}")


def claims_file(fmt: str) -> str:
    return _r(f"claims.{fmt}")


def claims_by_step_figure(fmt: str) -> str:
    """The budget-sensitive claims' effects against the training step."""
    return _r(f"claims_by_step.{fmt}")


def tracking_dir(backend: str) -> str:
    """Where an experiment tracker (TensorBoard, offline W&B, MLflow) writes every run's metrics."""
    return _r("tracking", backend)


# --- job records --------------------------------------------------------------------------------


def log_path(name: str) -> str:
    return _r("logs", f"{name}.log")


def bench_path(name: str) -> str:
    """Snakemake's per-job benchmark record (wall time, memory) of a rule, named like its log."""
    return _r("benchmarks", f"{name}.tsv")


def bench_result(name: str) -> str:
    """A benchmark rule's JSON (decoding or training throughput)."""
    return _r("bench", f"{name}.json")
