"""The process group of a run under torchrun, and the collectives the training loop takes part in.

On GPUs each process owns ``cuda:LOCAL_RANK`` before any CUDA work: the device is set first, then
the process group is bound to it (``device_id``), so every later ``.to(device)``, FSDP2's placement
and NCCL's communicator use that GPU and never GPU 0. NCCL accepts only tensors on the GPU its
communicator is bound to (gloo on CPU accepts anything, so the CPU tests alone would not see a
CPU tensor in a collective): every collective here builds or moves its tensor to
``ProcessGroup.device``. The group is destroyed when the run ends, also on an exception.

Every collective waits at most ``COLLECTIVE_TIMEOUT``, set explicitly rather than left to each
backend's default (10 minutes for NCCL, 30 for gloo). The longest a rank can work alone while the
others wait in a collective, at 8B parameters (trainer state about 114 GB: fp32 weights, Adam's two
moments and the exported weights; checkpoint export 16 GB in bf16, 32 GB in fp32):

- rank 0 writing and hashing the consolidated export: 32 GB at a 0.2 GB/s shared-filesystem write
  (a slow stream) plus 32 GB at 1.1 GB/s sha256 (``hashlib``, measured on this machine's AMD EPYC
  with SHA-NI: 1.1-1.6 GB/s from page cache) = 160 s + 30 s, about 3.2 minutes;
- the checkpoint's hashing, shared by the ranks (``checkpointing``): at most the largest file plus
  an even share, (114 / 8 + 16) GB = 30 GB on one 8-GPU node, 30 s at 1.1 GB/s or 150 s at 0.2 GB/s,
  and the ranks finish together, so the others wait only for the imbalance.

30 minutes is about nine times the worst of these, and a rank that really hangs is still reported.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from ..core.models import device_problem, require_triton

COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class ProcessGroup:
    """Where this process stands in a run: ``world`` processes, this one ``rank``, computing on
    ``device`` (its own GPU, or the CPU), the device every collective's tensor lives on."""

    world: int = 1
    rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def main(self) -> bool:
        return self.rank == 0


def from_environment(planned_gpus: int = 0) -> ProcessGroup:
    """torchrun's WORLD_SIZE, RANK and LOCAL_RANK (one process without them); the device is
    ``cuda:LOCAL_RANK`` where CUDA is available. A process that cannot have the GPU its job was given
    stops here, naming what it was given and what it sees (``device_problem``)."""
    env = {k: os.environ.get(k, "0") for k in ("RANK", "LOCAL_RANK")}
    world, rank, local = int(os.environ.get("WORLD_SIZE", "1")), int(env["RANK"]), int(env["LOCAL_RANK"])
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is not one of WORLD_SIZE {world} processes")
    if problem := device_problem(planned_gpus):
        raise RuntimeError(f"no GPU for this process: {problem}")
    device = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    require_triton(device)  # flex attention's kernels on a GPU
    return ProcessGroup(world, rank, device)


def setup(timeout: timedelta = COLLECTIVE_TIMEOUT, planned_gpus: int = 0) -> ProcessGroup:
    """Own this process's device, then start the process group bound to it (when there are several
    processes and none is started yet). ``planned_gpus``: the GPUs the plan launches the run on."""
    pg = from_environment(planned_gpus)
    if pg.device.type == "cuda":
        # segments that grow rather than new blocks of each size: less fragmentation at the edge of a plan
        # (read when the allocator starts, so before any CUDA work; a setting the job gives is kept)
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        torch.cuda.set_device(pg.device)  # before any CUDA work
    if pg.world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            pg.backend, device_id=pg.device if pg.device.type == "cuda" else None, timeout=timeout
        )
    return pg


def teardown() -> None:
    """Destroy the process group (its communicators) if one is started."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@contextlib.contextmanager
def process_group(timeout: timedelta = COLLECTIVE_TIMEOUT, planned_gpus: int = 0):
    """``setup`` for the length of a ``with`` block; the group is destroyed at its end, also on an
    exception, by the block that started it (a nested block uses its caller's group)."""
    owner = not torch.distributed.is_initialized()
    pg = setup(timeout, planned_gpus)
    try:
        yield pg
    finally:
        if owner:
            teardown()


def barrier(pg: ProcessGroup) -> None:
    if pg.world > 1:  # on NCCL, on this process's GPU (as the group is bound to it)
        torch.distributed.barrier(device_ids=[pg.device.index] if pg.backend == "nccl" else None)


def _reduced(values: torch.Tensor, pg: ProcessGroup, op: str = "sum") -> torch.Tensor:
    """``values`` reduced over the processes, on the group's device."""
    values = values.to(pg.device)
    if pg.world > 1:
        torch.distributed.all_reduce(values, op=getattr(torch.distributed.ReduceOp, op.upper()))
    return values


def all_finite(loss: torch.Tensor, pg: ProcessGroup) -> bool:
    """Whether the loss is finite on every process (each stops together, none waits on the others)."""
    bad = (~torch.isfinite(loss.detach())).to(torch.float32).reshape(1)
    return _reduced(bad, pg, "max").item() == 0


def whole_batch_values(terms: dict, pg: ProcessGroup) -> dict:
    """The micro-batch's loss terms as floats: each process's term is its share times the number of
    processes, so their mean over processes is the whole micro-batch's."""
    values = _reduced(torch.stack([v.detach().float() for v in terms.values()]), pg)
    if pg.world > 1:
        values = values / pg.world
    return {name: float(v) for name, v in zip(terms, values.cpu())}


def summed(values: list[float], pg: ProcessGroup) -> list[float]:
    """Per-process counts (a step's FLOPs) summed over the processes."""
    return _reduced(torch.tensor(values, dtype=torch.float64, device=pg.device), pg).tolist()


def peak_memory(pg: ProcessGroup) -> dict[str, float]:
    """The step's peak memory in GB, the largest over the processes: on GPUs what the caching allocator
    handed out and what it reserved from the driver since the step began (the planner's estimate is
    checked against these); on the CPU the process's peak resident set so far (the kernel keeps no
    per-step peak)."""
    if pg.device.type == "cuda":
        here = [torch.cuda.max_memory_allocated(pg.device), torch.cuda.max_memory_reserved(pg.device)]
        names = ("peak_allocated_gb", "peak_reserved_gb")
    else:
        import resource

        here, names = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], ("peak_rss_gb",)
    peaks = _reduced(torch.tensor(here, dtype=torch.float64), pg, "max").tolist()
    return {name: round(v / 1e9, 3) for name, v in zip(names, peaks)}


def segment_ends(start: float, to_next_checkpoint: float, hours: float, pg: ProcessGroup) -> bool:
    """Whether the time left before ``hours`` is too short to reach the next scheduled checkpoint
    (``to_next_checkpoint`` seconds at the last step's pace, with half again as margin); the
    processes agree (the latest estimate decides)."""
    late = float(time.time() - start + 1.5 * to_next_checkpoint > hours * 3600)
    return bool(_reduced(torch.tensor([late], device=pg.device), pg, "max").item())


def all_gathered(obj, pg: ProcessGroup) -> list:
    """Every process's ``obj`` (small, picklable), in rank order."""
    if pg.world == 1:
        return [obj]
    out = [None] * pg.world
    torch.distributed.all_gather_object(out, obj)  # NCCL: through the current device, set in ``setup``
    return out


def from_main(obj, pg: ProcessGroup):
    """Rank 0's ``obj`` (small, picklable) on every process."""
    if pg.world == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0, device=pg.device)
    return box[0]
