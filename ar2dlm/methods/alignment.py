"""REPR-ALIGN's loss term (``align:``): lambda * the mean over layers and masked positions of
1 - cos (or the mean squared difference) between the student's hidden states and the frozen
causal teacher's on the clean tokens. A run of any method may add it; method repr_align
starts from it."""

from __future__ import annotations

import math

from .spec import Term

# Open-dLLM's public code: lambda 10, cosine, every layer.
ALIGN_DEFAULTS = {"lambda": 10.0, "metric": "cos", "layers": "all"}

SCHEMA = {
    "description": "REPR-ALIGN term, lambda * mean(1 - cos) (or L2) between student and frozen causal teacher",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "lambda": {"type": "number", "minimum": 0},
        "metric": {"enum": ["cos", "l2"]},
        "layers": {
            "oneOf": [
                {"enum": ["all", "lower", "middle", "upper"]},
                {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            ]
        },
    },
}


def layer_indices(spec, n_layers: int) -> list[int]:
    """Hidden-state indices (0 = embedding output, n_layers = last layer) of a layer set."""
    if isinstance(spec, list):
        return spec
    third = math.ceil((n_layers + 1) / 3)
    return {
        "all": list(range(n_layers + 1)),
        "lower": list(range(0, third)),
        "middle": list(range(third, min(2 * third, n_layers + 1))),
        "upper": list(range(min(2 * third, n_layers + 1), n_layers + 1)),
    }[spec]


def layer_problems(run: dict, config: dict):
    """Aligned layers that a model of the run does not have."""
    layers = run["align"]["layers"]
    if not isinstance(layers, list):
        return
    for m in run["models"]:
        arch = config["models"][m].get("arch")
        if arch and max(layers) > arch["num_hidden_layers"]:
            yield (
                "align.layers",
                (f"layer {max(layers)} does not exist in {m} (hidden states 0..{arch['num_hidden_layers']})"),
            )


def memory(sz) -> dict[str, float]:
    """The student's hidden states of every layer, kept for the loss (with activation checkpointing
    too: they are the layers' outputs), and the teacher's, one more (its embedding output)."""
    shape = sz.shape
    return {
        "activations": shape.layers * sz.act * shape.hidden * sz.launch.rows * sz.positions,
        "teacher": (shape.layers + 1) * sz.act * shape.hidden * sz.launch.rows * sz.seq_len,
    }


TERM = Term(
    key="align",
    noun="an alignment term",
    defaults=ALIGN_DEFAULTS,
    schema=SCHEMA,
    loss="ar2dlm.training.objectives.alignment:align_loss",
    active=lambda run: run["align"]["lambda"] > 0,
    teacher="decoder",
    student_hidden=True,
    checks=layer_problems,
    memory=memory,
    description="REPR-ALIGN: align the student's hidden states to the frozen causal teacher's",
)
