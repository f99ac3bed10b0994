"""Conversion runs: a run names a method, whose defaults it starts from, and may compose further
objectives (alignment, distillation) and options. ``resolve_run`` gives the complete settings."""

from __future__ import annotations

import copy

from .config import ConfigError, deep_merge

_BASE = {"init": "ar", "attention": "bidirectional", "block_size": None, "shift": True, "masking": "uniform",
         "positional_beta": 0.0, "loss_weight": "inverse_t", "data": "subset", "align": None, "freeze": [],
         "distill": None}
ALIGN_DEFAULTS = {"lambda": 10.0, "metric": "cos", "layers": "all"}
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
    init_chain(config, name)
    return out


def init_chain(config: dict, name: str) -> list[str]:
    """The runs a run starts from, nearest first (``init: {run: NAME}``), checked to exist and not
    to loop."""
    chain, seen = [], {name}
    init = config["runs"][name].get("init")
    while isinstance(init, dict):
        source = init["run"]
        if source not in config["runs"]:
            raise ConfigError(f"runs.{name}.init.run", f"no such run {source!r} (known: {', '.join(config['runs'])})")
        if source in seen:
            raise ConfigError(f"runs.{name}.init.run", f"the runs start from each other in a loop: "
                              f"{' -> '.join([name, *chain, source])}")
        chain.append(source)
        seen.add(source)
        init = config["runs"][source].get("init")
    return chain
