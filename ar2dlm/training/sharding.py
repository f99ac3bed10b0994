"""Sharded training with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) under torchrun.

FSDP2 rather than accelerate: the trainer is a plain PyTorch loop whose randomness, checkpoints and
objectives are its own, and FSDP2 shards it with two calls and no launcher or config file of its
own; it runs on CPU with the gloo backend, so the sharded path is tested on the machines the tests
run on. Each decoder layer is one FSDP unit and the root holds the rest (embeddings, tied LM head,
final norm); parameters are gathered in the run's resolved dtype (bf16 or fp32), gradients reduced in
fp32, and the optimizer keeps fp32 state on the fp32 shards.

Checkpoints: the trainer state (model and optimizer) goes through ``torch.distributed.checkpoint``,
each rank writing its shards, and loads on any number of processes; the weights a study evaluates
are also gathered on rank 0 into a plain Hugging Face folder.
"""

from __future__ import annotations

import contextlib

import torch


def decoder_layers(model) -> list:
    """The decoder layers of a Hugging Face causal LM (Qwen3, Llama, ...) or of its decoder alone."""
    return list(getattr(model, "model", model).layers)


def device_mesh(pg):
    """The one-dimensional device mesh of the run's processes (``distributed.ProcessGroup``), on
    their own devices: FSDP2 places each rank's shard on the mesh's device of that rank, set
    explicitly rather than taken from whichever device is current."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(pg.device.type, (pg.world,))


def shard(model, dtype: str, mesh, frozen: bool = False) -> None:
    """Shard ``model`` in place across ``mesh``: one FSDP unit per decoder layer, then the root. A
    decoder without its LM head (a teacher read for hidden states) keeps its class: transformers
    records hidden states by the model's class name, which ``fully_shard`` on the root would
    change, so its embeddings are a unit of their own instead.

    A ``frozen`` model (a teacher) is resharded after each of its forwards, every unit of it: FSDP2
    keeps a root unit's parameters gathered after its forward for the backward pass that would
    reshard them, and a teacher has none, so its root (and, without a head, every layer: each is a
    root of its own) would stay gathered on every GPU for the rest of the run."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if dtype == "bf16" else torch.float32, reduce_dtype=torch.float32
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model if hasattr(model, "lm_head") else model.embed_tokens, mesh=mesh, mp_policy=policy)
    if frozen:
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]

        def reshard_all(*_):
            for unit in units:
                unit.reshard()

        model.register_forward_hook(reshard_all)


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


def exported_weights(model, dtype: str) -> dict | None:
    """The weights to write as the checkpoint's Hugging Face folder: consolidated on rank 0 (empty
    elsewhere; collective when sharded), tied weights once, in ``dtype``. None for an unsharded fp32
    model: it writes its own weights."""
    if not is_sharded(model) and dtype == "fp32":
        return None
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state = dict(model.state_dict())
    for tied in model.get_expanded_tied_weights_keys():  # written once, as the unsharded model writes them
        state.pop(tied, None)
    cast = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    return {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}


@contextlib.contextmanager
def _single_process_quiet():
    """torch.distributed.checkpoint warns that it assumes one process when none is set up: intended here."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_trainer_state(model, opt, path, world: int) -> None:
    """Model and optimizer state through torch.distributed.checkpoint, each rank writing its shards
    (a process count that loads it need not be the one that wrote it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    with _single_process_quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path), no_dist=world == 1)


def load_trainer_state(model, opt, path, world: int) -> None:
    """Load ``save_trainer_state``'s folder into the model and optimizer, resharded to this run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": optim_state}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=str(path), no_dist=world == 1)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def grad_norm_value(norm) -> float:
    """``clip_grad_norm_``'s total norm as a float (a DTensor when the parameters are sharded)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
