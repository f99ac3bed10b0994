"""One entry point for every benchmark kind, used by the evaluation rules: load any model the
pipeline wrote (AR teacher, conversion checkpoint, DPO'd or merged model), read its decoding
conventions from the JSON beside it, run the benchmark, return one JSON-ready result."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..config import deep_merge
from ..conventions import Conventions
from ..models import load_model
from ..provenance import library_versions, read_jsonl, write_jsonl

KINDS = ("code", "math", "harness", "embeddings", "throughput", "likelihood")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # torch dtype names; torch loads with the model, not at DAG build


def benchmark_settings(config: dict, name: str) -> dict:
    """The benchmark's config over the preset's default decoding settings."""
    return deep_merge(config["eval"]["decoding"], config["eval"]["benchmarks"][name])


def _code(model, tok, conv, spec, inputs, seed):
    from .code import evaluate_code

    return evaluate_code(model, tok, conv, read_jsonl(inputs["problems"]), spec, seed=seed)


def _throughput(model, tok, conv, spec, inputs, seed):
    """Accuracy, tokens/s and tokens per step across thresholds (and decoding block sizes for
    bidirectional DLMs; a block-attention model decodes with its own); one row for AR models."""
    from .code import evaluate_code

    tasks = read_jsonl(inputs["problems"])
    if not conv.is_diffusion:
        grid = [(None, None)]
    elif conv.attention == "block":
        grid = [(t, conv.block_size) for t in spec["thresholds"]]
    else:
        grid = [(t, b) for b in spec["block_sizes"] for t in spec["thresholds"]]
    rows = []
    for threshold, block in grid:
        res = evaluate_code(model, tok, conv, tasks, {**spec, "threshold": threshold, "block_size": block,
                                                      "n_samples": 1}, seed=seed)
        rows.append({"threshold": threshold, "block_size": block, **res["metrics"], **res["decoding"]})
    return {"metrics": {}, "n_tasks": len(tasks), "rows": rows}


def _math(model, tok, conv, spec, inputs, seed):
    from .maths import evaluate_math

    items = read_jsonl(inputs["math"])
    return evaluate_math(model, tok, conv, items[: spec["limit"]] if spec.get("limit") else items, spec, seed=seed)


def _harness(model_dir, spec, inputs, seed, dtype):
    from .harness import HarnessLM, evaluate_harness, local_task

    lm = HarnessLM(model_dir, batch_size=spec["batch_size"], elbo_samples=spec["elbo_samples"],
                   threshold=spec["threshold"], block_size=spec.get("block_size"), seed=seed, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        task = spec["task"]
        if spec["local"]:
            from ..data.math_suite import choice_items

            data = Path(tmp) / f"{task}.jsonl"
            write_jsonl(data, choice_items(read_jsonl(inputs["math"]), seed=0))
            task = local_task(task, data)
        scores = evaluate_harness(lm, [task], limit=spec.get("limit"), num_fewshot=spec.get("num_fewshot"), seed=seed)
    return {"metrics": next(iter(scores.values())), "tasks": scores}


def _embeddings(model, tok, conv, spec, inputs, seed, name):
    from .embeddings import MeanPooledEncoder, docstring_retrieval_task, evaluate_embeddings

    tasks = [docstring_retrieval_task(read_jsonl(inputs["code"])) if t == "docstring_retrieval" else t
             for t in spec["tasks"]]
    scores = evaluate_embeddings(MeanPooledEncoder(model, tok, conv, name, batch_size=spec["batch_size"]), tasks)
    mean = sum(s["main_score"] for s in scores.values()) / len(scores)
    return {"metrics": {"main_score": mean}, "tasks": scores,
            "pooling": "mean, " + ("bidirectional" if conv.is_diffusion else "causal")}


def _likelihood(model, tok, conv, spec, inputs, seed):
    """Per-token negative log-likelihood of held-out completions: exact for AR models, the ELBO
    bound (an upper bound on the NLL) for DLMs, with the same masks for every model."""
    from ..likelihood import loglikelihood
    from ..tokenization import encode_pair

    metrics = {}
    for domain in ("code", "math"):
        items = read_jsonl(inputs[domain])[: spec["limit"]]
        key = "canonical_solution" if domain == "code" else "completion"
        pairs = [encode_pair(tok, it["prompt"], it[key]) for it in items]
        kwargs = {"n_samples": spec["elbo_samples"], "seed": seed, "batch_size": spec["batch_size"]} if conv.is_diffusion else {}
        lls = loglikelihood(model, conv, pairs, **kwargs)
        metrics[f"nll_per_token_{domain}"] = -sum(lls) / sum(len(c) for _, c in pairs)
    return {"metrics": metrics, "bound": "ELBO (upper bound on NLL)" if conv.is_diffusion else "exact"}


def run_benchmark(name: str, spec: dict, model_dir: str | Path, inputs: dict, *, seed: int) -> dict:
    """Evaluate the model in ``model_dir`` on benchmark ``name`` with settings ``spec``."""
    t0 = time.time()
    kind = spec["kind"]
    if kind not in KINDS:
        raise ValueError(f"unknown benchmark kind {kind!r} (known: {', '.join(KINDS)})")
    info = {}
    import torch

    dtype = getattr(torch, DTYPES[spec.get("dtype", "fp32")])
    if kind == "harness":
        from ..models import load_conventions

        info = load_conventions(model_dir)
        result = _harness(str(model_dir), spec, inputs, seed, dtype)
    else:
        model, tok, info = load_model(model_dir, dtype=dtype)
        conv = Conventions.from_dict(info)
        if kind == "embeddings":
            result = _embeddings(model, tok, conv, spec, inputs, seed, name)
        else:
            fn = {"code": _code, "math": _math, "throughput": _throughput, "likelihood": _likelihood}[kind]
            result = fn(model, tok, conv, spec, inputs, seed)
    return {"benchmark": name, "kind": kind, "model_dir": str(model_dir), "method": info.get("method"),
            "conventions": {k: info.get(k) for k in ("attention", "shift", "block_size")},
            "seed": seed, "settings": spec, **result, "wall_seconds": round(time.time() - t0, 2),
            "versions": library_versions()}
