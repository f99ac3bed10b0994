"""Sharded training with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) under torchrun.

FSDP2 rather than accelerate: the trainer is a plain PyTorch loop whose randomness, checkpoints and
objectives are its own, and FSDP2 shards it with two calls and no launcher or config file of its
own; it runs on CPU with the gloo backend, so the sharded path is tested on the machines the tests
run on. Each decoder layer is one FSDP unit and the root holds the rest (embeddings, tied LM head,
final norm); parameters are gathered in ``training.dtype`` (bf16 or fp32), gradients reduced in
fp32, and the optimizer keeps fp32 state on the fp32 shards. Activation checkpointing per decoder
layer is ``training.activation_checkpointing``.

State dicts go through ``torch.distributed.checkpoint.state_dict``: the full (consolidated) model
and optimizer state on rank 0, keyed by parameter name, so a checkpoint written by a sharded run is
a plain Hugging Face folder plus an optimizer state any process count can load.
"""

from __future__ import annotations

import contextlib

import torch


def _full():
    """Consolidated state on rank 0, on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def decoder_layers(model) -> list:
    """The decoder layers of a Hugging Face causal LM (Qwen3, Llama, ...)."""
    return list(model.model.layers)


def shard(model, training: dict) -> None:
    """Shard ``model`` in place across the process group: one FSDP unit per decoder layer, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if training.get("activation_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if training["dtype"] == "bf16" else torch.float32,
                                  reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gathered(model):
    """Keep a sharded model's parameters gathered for a while (on-policy rollouts): each rank then
    decodes its own prompts with as many forward passes as it needs, without collectives. A no-op
    for a model that is not sharded."""
    if not is_sharded(model):
        yield model
        return
    model.unshard()
    model.set_reshard_after_forward(False)
    try:
        yield model
    finally:
        model.reshard()
        model.set_reshard_after_forward(True)


def full_model_state(model) -> dict:
    """The consolidated state dict (on CPU) on rank 0; empty on other ranks. Collective when sharded."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_full())
    for tied in model.get_expanded_tied_weights_keys():  # saved once, as the unsharded model saves them
        state.pop(tied, None)
    return state


def full_optimizer_state(model, opt) -> dict:
    """The optimizer state keyed by parameter name, consolidated on rank 0. Collective when sharded."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=_full())


def load_optimizer_state(model, opt, state: dict) -> None:
    """Load a state from ``full_optimizer_state`` (any process count wrote it) into ``opt``; a state
    keyed by parameter index (``opt.state_dict()``, older single-process checkpoints) as it is."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if all(isinstance(k, int) for k in state["state"]):
        opt.load_state_dict(state)
        return
    set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True))


def load_model_state(model, state: dict) -> None:
    """Load a full state dict (every rank holds it) into a model, sharded or not."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def grad_norm_value(norm) -> float:
    """``clip_grad_norm_``'s total norm as a float (a DTensor when the parameters are sharded)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
