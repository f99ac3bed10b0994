"""One entry point for every benchmark kind, used by the evaluation rules: load any model the
pipeline wrote (AR teacher, conversion checkpoint, DPO'd or merged model) with its decoding
conventions, run the benchmark, return one JSON-ready result.

``BENCHMARK_KINDS`` is the registry of kinds (the schema's ``eval.benchmarks.*.kind`` names, a test
ties the two): how each runs, the data it reads (by name: the pipeline says where each lies), the
metrics its tables and claims show and which of them are not scores in [0, 1], whether it generates
text (its generation lengths must then be whole decoding blocks) or runs generated programs, and the
checks of its settings the DAG build runs."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..core.models import load_conventions, load_model, resolve_device
from ..core.precision import resolve_dtype, torch_dtype
from ..provenance import code_commit, library_versions, read_jsonl, settings_hash, write_jsonl

LOCAL_TASKS = Path(__file__).parent / "tasks"  # lm-eval task configs kept here, built from the maths suite
LOCAL_HARNESS_TASKS = tuple(sorted(p.stem for p in LOCAL_TASKS.glob("*.yaml")))
LOCAL_EMBEDDING_TASKS = (
    "docstring_retrieval",
    "function_to_docstring",
    "example_retrieval",
)  # built here; others: mteb's


def local_task(name: str, data_file: str | Path) -> dict:
    """A task config kept in this repo (``tasks/<name>.yaml``) pointed at a data file."""
    cfg = yaml.safe_load((LOCAL_TASKS / f"{name}.yaml").read_text())
    cfg["dataset_kwargs"]["data_files"]["test"] = str(Path(data_file).resolve())
    return cfg


def harness_metric(spec: dict) -> str:
    """A harness benchmark's headline metric: its lm-eval task's own first metric (aime24:
    exact_match; gpqa_diamond_zeroshot and the local choice task: acc)."""
    from ..core.hub import harness_entry

    if spec["local"]:
        return yaml.safe_load((LOCAL_TASKS / f"{spec['task']}.yaml").read_text())["metric_list"][0]["metric"]
    return harness_entry(spec["task"])["metric"]


def cached_harness_task(name: str) -> dict:
    """An installed lm-eval task's config reading its data set from the cached hub snapshot (jobs
    run with the hub offline; lm-eval would otherwise ask the hub)."""
    from ..core.hub import harness_task_config, local_snapshot

    cfg = harness_task_config(name)
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    cfg["dataset_path"] = local_snapshot(cfg["dataset_path"], revision=kwargs.pop("revision", None))
    cfg["dataset_kwargs"] = kwargs or None
    return cfg


def _dtype_name(spec) -> str:
    """fp32 or bf16: the evaluated weights' dtype on the device the job runs on (``auto``: bf16
    where that device computes it natively)."""
    return resolve_dtype(spec.get("dtype", "fp32"), resolve_device(spec.get("device", "auto")))


def _dtype(spec):
    """The torch dtype of the evaluated weights (torch loads with the model, not at DAG build)."""
    return torch_dtype(_dtype_name(spec))


def _load(model_dir, spec):
    return load_model(model_dir, dtype=_dtype(spec), device=spec.get("device", "auto"))


def _code(model_dir, spec, inputs, seed, name):
    from .code import evaluate_code
    from .sandbox import require_sandbox

    require_sandbox()  # before the model loads
    model, tok, conv, info = _load(model_dir, spec)
    return info, evaluate_code(model, tok, conv, read_jsonl(inputs["problems"]), spec, seed=seed)


def _throughput(model_dir, spec, inputs, seed, name):
    """Accuracy, tokens/s and tokens per step across thresholds (and decoding block sizes for
    bidirectional DLMs; a block-attention model decodes with its own); one row for AR models."""
    from .code import evaluate_code
    from .sandbox import require_sandbox

    require_sandbox()
    model, tok, conv, info = _load(model_dir, spec)
    tasks = read_jsonl(inputs["problems"])
    if not conv.is_diffusion:
        grid = [(None, None)]
    elif conv.attention == "block":
        grid = [(t, conv.block_size) for t in spec["thresholds"]]
    else:
        grid = [(t, b) for b in spec["block_sizes"] for t in spec["thresholds"]]
    rows = []
    for threshold, block in grid:
        res = evaluate_code(
            model,
            tok,
            conv,
            tasks,
            # the sweep is over thresholds: a fixed number of steps per block would override them
            {**spec, "threshold": threshold, "steps_per_block": None, "block_size": block, "n_samples": 1},
            seed=seed,
        )
        rows.append({"threshold": threshold, "block_size": block, **res["metrics"], **res["decoding"]})
    return info, {"metrics": {}, "n_tasks": len(tasks), "rows": rows}


def _math(model_dir, spec, inputs, seed, name):
    from .maths import evaluate_math

    model, tok, conv, info = _load(model_dir, spec)
    items = read_jsonl(inputs["math"])
    return info, evaluate_math(
        model, tok, conv, items[: spec["limit"]] if spec.get("limit") else items, spec, seed=seed
    )


def _harness(model_dir, spec, inputs, seed, name):
    """lm-eval through the ``ar2dlm`` model class, which loads the model itself."""
    from .harness import HarnessLM, evaluate_harness

    lm = HarnessLM(
        str(model_dir),
        batch_size=spec["batch_size"],
        elbo_samples=spec["elbo_samples"],
        threshold=spec["threshold"],
        steps_per_block=spec.get("steps_per_block"),
        block_size=spec.get("block_size"),
        seed=seed,
        dtype=_dtype(spec),
        device=spec.get("device", "auto"),
        max_gen_toks=spec.get("max_gen_toks", HarnessLM.MAX_GEN_TOKS),
    )
    with tempfile.TemporaryDirectory() as tmp:
        task = spec["task"]
        if spec["local"]:
            from ..data.math_suite import choice_items

            data = Path(tmp) / f"{task}.jsonl"
            write_jsonl(data, choice_items(read_jsonl(inputs["math"]), seed=0))
            task = local_task(task, data)
        else:
            task = cached_harness_task(task)
        scores = evaluate_harness(lm, [task], limit=spec.get("limit"), num_fewshot=spec.get("num_fewshot"), seed=seed)
    return load_conventions(model_dir), {"metrics": next(iter(scores.values())), "tasks": scores}


def _embeddings(model_dir, spec, inputs, seed, name):
    from .embeddings import MeanPooledEncoder, code_retrieval_task, evaluate_embeddings

    model, tok, conv, info = _load(model_dir, spec)
    tasks = [
        code_retrieval_task(t, read_jsonl(inputs["code"])) if t in LOCAL_EMBEDDING_TASKS else t for t in spec["tasks"]
    ]
    scores = evaluate_embeddings(MeanPooledEncoder(model, tok, conv, name, batch_size=spec["batch_size"]), tasks)
    mean = sum(s["main_score"] for s in scores.values()) / len(scores)
    return info, {
        "metrics": {"main_score": mean},
        "tasks": scores,
        "pooling": "mean, " + ("bidirectional" if conv.is_diffusion else "causal"),
    }


def _likelihood(model_dir, spec, inputs, seed, name):
    """Per-token negative log-likelihood of held-out completions: exact for AR models, the ELBO
    bound (an upper bound on the NLL) for DLMs, with the same masks for every model."""
    from ..core.likelihood import loglikelihood
    from ..data.tokenization import encode_pair

    model, tok, conv, info = _load(model_dir, spec)
    metrics = {}
    for domain in ("code", "math"):
        items = read_jsonl(inputs[domain])[: spec["limit"]]
        key = "canonical_solution" if domain == "code" else "completion"
        pairs = [encode_pair(tok, it["prompt"], it[key]) for it in items]
        kwargs = (
            {"n_samples": spec["elbo_samples"], "seed": seed, "batch_size": spec["batch_size"]}
            if conv.is_diffusion
            else {}
        )
        lls = loglikelihood(model, conv, pairs, **kwargs)
        metrics[f"nll_per_token_{domain}"] = -sum(lls) / sum(len(c) for _, c in pairs)
    return info, {"metrics": metrics, "bound": "ELBO (upper bound on NLL)" if conv.is_diffusion else "exact"}


def _reward(model_dir, spec, inputs, seed, name):
    """Helpfulness: the model's answers to a preference domain's held-out prompts against the
    domain's chosen answers, judged by a local reward model (``reward.py`` says why)."""
    from ..core.hub import is_hub_id, local_snapshot
    from .reward import evaluate_reward

    judge = spec["judge"]  # found before the model loads
    judge_dir = local_snapshot(judge, "model", spec.get("judge_revision")) if is_hub_id(judge) else judge
    loaded = _load(model_dir, spec)
    items = read_jsonl(inputs[preference_data(spec)])
    items = items[: spec["limit"]] if spec.get("limit") else items
    return loaded.info, evaluate_reward(loaded, items, spec, judge_dir, seed=seed)


def preference_data(spec: dict) -> str:
    """The data name of a reward benchmark's prompts: its preference domain's held-out split."""
    return f"preferences:{spec['domain']}"


# The data a benchmark reads, the keys of the ``inputs`` its run gets: its problems file (built for
# this benchmark from its source), a held-out synthetic suite, or a preference domain's held-out split
# (``preferences:<domain>``).
BENCHMARK_DATA = ("problems", "code", "math", "preferences")  # the last read as preferences:<domain>


def installed_tasks(package: str) -> tuple[str, set[str]]:
    """(version, names) of the tasks an installed package registers (lm-eval, mteb), cached per
    version (building lm-eval's task index parses every task's config)."""
    from importlib.metadata import version

    from ..core.hub import cached_per_version

    def compute():
        return sorted({"lm_eval": _lm_eval_tasks, "mteb": _mteb_tasks}[package]())

    return version(package), set(cached_per_version(package, "tasks", "names", compute))


def _lm_eval_tasks() -> list[str]:
    from lm_eval.tasks import TaskManager

    return list(TaskManager().all_tasks)


def _mteb_tasks() -> list[str]:
    import mteb

    from ..core.hub import quiet_mteb

    with quiet_mteb():
        every = mteb.get_tasks(
            exclude_superseded=False, exclude_aggregate=False, exclude_private=False, exclude_beta=False
        )
    return [t.metadata.name for t in every]


# The checks of a kind's settings (``spec``) against the config's data section, run at DAG build:
# each yields (the key under the benchmark, the problem).


def _check_code(spec: dict, data: dict) -> Iterator[tuple[str, str]]:
    if spec["n_samples"] > 1 and spec["temperature"] == 0:
        yield "temperature", f"{spec['n_samples']} samples per task need a temperature above 0"


def _check_harness(spec: dict, data: dict) -> Iterator[tuple[str, str]]:
    from ..core.hub import lm_eval_task_path

    if spec["local"] and spec["task"] not in LOCAL_HARNESS_TASKS:
        yield "task", f"no local task {spec['task']!r} (local tasks: {', '.join(LOCAL_HARNESS_TASKS)})"
    if not spec["local"] and lm_eval_task_path(spec["task"]) is None:
        v, known = installed_tasks("lm_eval")  # groups and tags too (lm-eval's whole index)
        if spec["task"] not in known:
            yield "task", f"{spec['task']!r} is not a task of the installed lm-eval {v} (`lm-eval ls tasks` lists them)"


def _check_embeddings(spec: dict, data: dict) -> Iterator[tuple[str, str]]:
    hub_tasks = [t for t in spec.get("tasks", []) if t not in LOCAL_EMBEDDING_TASKS]
    if hub_tasks:
        v, known = installed_tasks("mteb")
        if unknown := [t for t in hub_tasks if t not in known]:
            yield (
                "tasks",
                f"{', '.join(map(repr, unknown))} not a task of the installed mteb {v} (mteb.get_tasks() lists them)",
            )


def _check_reward(spec: dict, data: dict) -> Iterator[tuple[str, str]]:
    domains = data["preferences"]["domains"]
    if spec["domain"] not in domains:
        yield (
            "domain",
            (
                f"{spec['domain']!r} is not a key of data.preferences.domains ({', '.join(domains)}): its held-out "
                "prompts are the benchmark's"
            ),
        )
        return
    held_out = domains[spec["domain"]].get("n_eval", data["preferences"]["n_eval"])
    if spec.get("limit") and spec["limit"] > held_out:
        yield (
            "limit",
            (
                f"{spec['limit']} prompts asked, more than data.preferences holds for {spec['domain']} "
                f"({held_out} held out)"
            ),
        )


def _no_checks(spec: dict, data: dict) -> Iterator[tuple[str, str]]:
    return iter(())


# The hub repositories a kind's settings read, as (repo type, path, revision).


def _harness_assets(spec: dict) -> Iterator[tuple[str, str, str | None]]:
    from ..core.hub import harness_dataset

    if not spec["local"]:
        ds = harness_dataset(spec["task"])
        yield "dataset", ds["path"], ds["revision"]


def _embedding_assets(spec: dict) -> Iterator[tuple[str, str, str | None]]:
    from ..core.hub import mteb_dataset

    for task in spec["tasks"]:
        if task not in LOCAL_EMBEDDING_TASKS:
            ds = mteb_dataset(task)
            yield "dataset", ds["path"], ds["revision"]


def _reward_assets(spec: dict) -> Iterator[tuple[str, str, str | None]]:
    yield "model", spec["judge"], spec.get("judge_revision")


def _no_assets(spec: dict) -> Iterator[tuple[str, str, str | None]]:
    return iter(())


@dataclass(frozen=True)
class BenchmarkKind:
    run: Callable  # (model_dir, spec, inputs, seed, benchmark name) -> (model info, result)
    reads: Callable[[dict], tuple[str, ...]]  # spec -> the BENCHMARK_DATA it reads (``inputs`` names their files)
    metrics: tuple[str, ...]  # what its tables show (and a claim may read); the first is the headline
    decoded: bool = False  # generates text with the model's sampler
    rows: bool = False  # one result row per decoding setting (tables take the best row)
    suite: str | None = None  # the data config section of the synthetic suite it reads (a limit is checked against it)
    unbounded: tuple[str, ...] = ()  # its metrics that are not scores in [0, 1] (no floor, ceiling or mean of scores)
    rates: tuple[str, ...] = ()  # its metrics that measure speed, not accuracy
    sandboxed: bool = False  # runs the model's programs (in the bubblewrap sandbox)
    scores_by_elbo: bool = False  # scores given continuations by the model's likelihood (ELBO), generating none
    checks: Callable[[dict, dict], Iterator[tuple[str, str]]] = _no_checks  # (spec, config data) -> problems
    hub_assets: Callable[[dict], Iterator[tuple[str, str, str | None]]] = _no_assets  # spec -> hub repositories
    headline: Callable[[dict], str] | None = None  # spec -> its headline metric, where not the first of ``metrics``

    @property
    def scored(self) -> bool:
        """Its headline metric is a score in [0, 1]."""
        return self.metrics[0] not in self.unbounded

    def headline_metric(self, spec: dict) -> str:
        return self.headline(spec) if self.headline else self.metrics[0]


BENCHMARK_KINDS = {
    "code": BenchmarkKind(
        _code,
        lambda spec: ("problems",),
        ("base_pass@1", "plus_pass@1", "base_pass@10", "plus_pass@10"),
        decoded=True,
        suite="code_suite",
        sandboxed=True,
        checks=_check_code,
    ),
    "math": BenchmarkKind(_math, lambda spec: ("math",), ("exact_match",), decoded=True, suite="math_suite"),
    "harness": BenchmarkKind(
        _harness,
        lambda spec: ("math",) if spec["local"] else (),
        ("acc", "exact_match"),
        scores_by_elbo=True,
        checks=_check_harness,
        hub_assets=_harness_assets,
        headline=harness_metric,
    ),
    "embeddings": BenchmarkKind(
        _embeddings,
        lambda spec: ("code",) if set(LOCAL_EMBEDDING_TASKS) & set(spec["tasks"]) else (),
        ("main_score",),
        checks=_check_embeddings,
        hub_assets=_embedding_assets,
    ),
    "throughput": BenchmarkKind(
        _throughput,
        lambda spec: ("problems",),
        ("base_pass@1", "tokens_per_step", "tokens_per_s"),
        decoded=True,
        rows=True,
        suite="code_suite",
        unbounded=("tokens_per_step", "tokens_per_s"),
        rates=("tokens_per_step", "tokens_per_s"),
        sandboxed=True,
    ),
    "likelihood": BenchmarkKind(
        _likelihood,
        lambda spec: ("code", "math"),
        ("nll_per_token_code", "nll_per_token_math"),
        unbounded=("nll_per_token_code", "nll_per_token_math"),
        scores_by_elbo=True,
    ),
    "reward": BenchmarkKind(
        _reward,
        lambda spec: (preference_data(spec),),
        ("win_rate", "mean_reward"),
        decoded=True,
        unbounded=("mean_reward",),
        checks=_check_reward,
        hub_assets=_reward_assets,
    ),
}


def run_benchmark(name: str, spec: dict, model_dir: str | Path, inputs: dict, *, seed: int) -> dict:
    """Evaluate the model in ``model_dir`` on benchmark ``name`` with settings ``spec``."""
    t0 = time.time()
    kind = spec["kind"]
    if kind not in BENCHMARK_KINDS:
        raise ValueError(f"unknown benchmark kind {kind!r} (known: {', '.join(BENCHMARK_KINDS)})")
    info, result = BENCHMARK_KINDS[kind].run(model_dir, spec, inputs, seed, name)
    return {
        "benchmark": name,
        "kind": kind,
        "model_dir": str(model_dir),
        "method": info.get("method"),
        "conventions": {k: info.get(k) for k in ("attention", "shift", "block_size")},
        "seed": seed,
        "settings": spec,
        **result,
        "wall_seconds": round(time.time() - t0, 2),
        "versions": library_versions(_dtype_name(spec)),
        # which code and settings made this number: the model's recorded settings (a run's
        # resolved config, a DPO's or a merge's) and the benchmark's
        "provenance": {
            "commit": code_commit(),
            "model_settings_sha256": settings_hash(info.get("run_settings", info)),
            "benchmark_settings_sha256": settings_hash(spec),
        },
    }
