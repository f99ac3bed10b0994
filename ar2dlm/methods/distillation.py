"""OPDLM's loss term (``distill:``): a divergence between the frozen AR teacher's next-token
distribution and the student's at masked positions, on the student's own decoding states
(on-policy) or on random masks of clean completions (off-policy). It brings its own objective
(:class:`Distillation`), which replaces masked diffusion; added terms (alignment) ride on it, their
teacher hidden states from the distillation's teacher forward."""

from __future__ import annotations

import math

from ..core.conventions import block_misfit
from ..data.corpus import PROMPT_SOURCES
from .spec import Term

# divelab/OPDLM's public code: forward KL, threshold 0.9, on-policy, rollouts sampled at temperature 1
# (configs/rl_bd3lm.yaml: temperature 1.0, top_p 1.0, top_k 0), the loss on the masked positions before
# the rollout's first end-of-text.
DISTILL_DEFAULTS = {
    "on_policy": True,
    "divergence": "forward_kl",
    "top_k": None,
    "threshold": 0.9,
    "temperature": 1.0,
    "prompts": "all",
    "curriculum": None,
    "rollout_length": None,
}

SCHEMA = {
    "description": "OPDLM term, KL between the frozen AR teacher and the student on masked positions",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "on_policy": {
            "type": "boolean",
            "description": "true: the student's own trajectories; false: random masks of clean data",
        },
        "divergence": {"enum": ["forward_kl", "reverse_kl", "jsd"]},
        "top_k": {"type": ["integer", "null"], "minimum": 1},
        "threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "temperature": {
            "type": "number",
            "minimum": 0,
            "description": "the on-policy rollouts' sampling temperature (0: greedy)",
        },
        "prompts": {
            "type": "string",
            "description": "all, code or math (the synthetic corpus), or a key of data.prompt_sets",
        },
        "curriculum": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["min_length", "max_length", "warmup_steps"],
                    "properties": {
                        "min_length": {"type": "integer", "minimum": 1},
                        "max_length": {"type": "integer", "minimum": 1},
                        "warmup_steps": {"type": "integer", "minimum": 1},
                    },
                },
            ]
        },
        "rollout_length": {"type": "integer", "minimum": 1},
    },
}


def rollout_length(distill: dict, step: int, block_size: int) -> int:
    """Fixed length, or the cosine curriculum from min_length to max_length over warmup_steps,
    rounded down to whole blocks."""
    c = distill["curriculum"]
    if not c:
        return distill["rollout_length"]
    frac = 0.5 * (1 - math.cos(math.pi * min(1.0, step / c["warmup_steps"])))
    length = c["min_length"] + frac * (c["max_length"] - c["min_length"])
    return max(block_size, int(length) // block_size * block_size)


def document_selection(run: dict) -> str:
    """Which documents of its corpus the run trains on: the prompts of a synthetic-corpus source
    (``prompts_<name>``, PROMPT_SOURCES), or ``documents`` (a prompt set's file as is)."""
    prompts = run["distill"]["prompts"]
    return f"prompts_{prompts}" if prompts in PROMPT_SOURCES else "documents"


def training_data(run: dict, prompt_sets: dict) -> tuple[str, str]:
    """A prompt set's file, or the run's corpus cut with the prompts of a source of it."""
    prompts = run["distill"]["prompts"]
    return (f"promptset_{prompts}", "documents") if prompts in prompt_sets else (run["data"], document_selection(run))


def problems(run: dict, config: dict):
    """Prompts that exist for the corpus, clean completions off-policy, a rollout length that whole
    blocks make up (the pipeline names the first problem)."""
    key, d, sets = "distill", run["distill"], config["data"]["prompt_sets"]
    if d["prompts"] in PROMPT_SOURCES:
        if config["data"]["corpus"]["source"] != "synthetic":
            yield (
                f"{key}.prompts",
                (
                    f"{d['prompts']!r} selects prompts of the synthetic corpus; with a hub corpus "
                    "name a key of data.prompt_sets"
                ),
            )
    elif d["prompts"] not in sets:
        yield (
            f"{key}.prompts",
            (
                f"{d['prompts']!r} is neither all, code, math nor a key of data.prompt_sets "
                f"({', '.join(sets) or 'none defined'})"
            ),
        )
    elif not d["on_policy"] and not sets[d["prompts"]].get("completion_field"):
        yield (
            f"{key}.on_policy",
            (
                f"off-policy distillation needs clean completions; data.prompt_sets.{d['prompts']} "
                "has no completion_field"
            ),
        )
    lengths = [d["rollout_length"]] if d["rollout_length"] else []
    if d["curriculum"]:
        c = d["curriculum"]
        if c["min_length"] > c["max_length"]:
            yield f"{key}.curriculum.min_length", f"{c['min_length']} exceeds max_length {c['max_length']}"
        lengths += [c["min_length"], c["max_length"]]
    if not lengths:
        yield f"{key}.rollout_length", "on- and off-policy distillation need a rollout length (or a curriculum)"
    for length in lengths:
        if run["block_size"] and (problem := block_misfit(run["block_size"], length, "the rollout length")):
            yield key, problem


def longest_rollout(distill: dict, block_size: int) -> int:
    """The longest rollout of a run: its fixed length, or its curriculum's end."""
    c = distill["curriculum"]
    return distill["rollout_length"] if not c else max(block_size, c["max_length"] // block_size * block_size)


def canvas(run: dict) -> int:
    """The longest row an on-policy step trains on: a prompt (up to a row of ``seq_len`` less one
    token: ``data.token_rows.document_rows``) and the longest rollout after it. Off-policy rows are
    cut from a row of ``seq_len``."""
    d, seq_len = run["distill"], run["training"]["seq_len"]
    return seq_len - 1 + longest_rollout(d, run["block_size"]) if d["on_policy"] else seq_len


def memory(sz) -> dict[str, float]:
    """The teacher's logits at the masked positions; on-policy over several GPUs, the student
    gathered whole to decode its rollouts, with its KV cache (a phase apart from the step)."""
    out = {"teacher": sz.act * sz.masked * sz.shape.vocab}
    if sz.run["distill"]["on_policy"] and sz.launch.gpus > 1:
        out["rollout"] = sz.act * sz.shape.params + sz.shape.kv_cache_bytes(sz.seq_len * sz.launch.rows, sz.act)
    return out


# The fixed cost of one Hugging Face decoder forward on a GPU, per layer: module calls, dispatch and
# kernel launches, which a single-token decoding forward cannot hide behind its arithmetic. 0.9 ms a
# layer is 32 ms for Qwen3-8B's 36 layers, the middle of the 25-40 ms an 8B HF forward takes at
# decoding batch sizes on an H100 (eager attention, no CUDA graphs), against 4.9 ms for reading its
# weights at 3.35 TB/s. On CPU the dispatch alone measures 0.43 ms a layer plus 1.5 ms a forward
# (17 ms at 36 layers; benchmarks/forward_overhead.py, which measures the GPU figure too).
FORWARD_OVERHEAD_MS_PER_LAYER = 0.9


def decode_seconds(shape, run: dict, launch, cluster: dict) -> float:
    """An on-policy step's decoding, which memory bandwidth and per-forward overhead bound, not
    FLOPs: up to one forward per rollout token (a block of ``block_size`` tokens takes at most
    ``block_size`` steps), each reading the gathered bf16 weights and the KV cache of the rows, and
    each paying the model's fixed cost per forward (``cluster.forward_overhead_ms_per_layer``)."""
    if not run["distill"]["on_policy"]:
        return 0.0
    length = run["training"]["seq_len"]
    kv = shape.kv_cache_bytes(length * launch.rows, 2)
    overhead = shape.layers * cluster.get("forward_overhead_ms_per_layer", FORWARD_OVERHEAD_MS_PER_LAYER) / 1e3
    return length * ((2 * shape.params + kv) / (cluster["gpu_bandwidth_tb_s"] * 1e12) + overhead)


TERM = Term(
    key="distill",
    noun="a distillation term",
    defaults=DISTILL_DEFAULTS,
    schema=SCHEMA,
    objective="ar2dlm.training.objectives.distillation:Distillation",
    teacher="head",
    checks=problems,
    memory=memory,
    decode_seconds=decode_seconds,
    training_data=training_data,
    positions=canvas,
    description="OPDLM: distil the frozen AR teacher into the student on its own decoding states",
)
