"""What several tests (and ``benchmarks/gpu_check.py``) build the same way: the tiny Qwen3 shape of a
test teacher, torchrun's command line, and a CPU fake of CUDA graphs' output lifetimes for the decode
engine. Plain Python (no pytest), so that a benchmark imports it."""

import json
import sys
from pathlib import Path

TINY_ARCH = {  # a 2-layer, 32-wide Qwen3: a teacher built in milliseconds
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
}


def torchrun(nproc: int = 2) -> list[str]:
    """The command that starts ``nproc`` local processes with torchrun; the script and its arguments follow."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def smoke_job(root, run: dict, out, seed: int = 0, **job):
    """A smoke conversion job of ``run`` reading ``root``/teacher and ``root``/corpus.jsonl into ``out``."""
    from ar2dlm.training.trainer import TrainJob

    root = Path(root)
    return TrainJob(
        run, root / "teacher", root / "corpus.jsonl", out, seed=seed, preset="smoke", model_name="tiny", **job
    )


def convert_argv(run: dict, teacher, corpus, out, preset: str = "smoke", model: str = "tiny") -> list[str]:
    """``ar2dlm.training.convert_run``'s command line: ``run`` from ``teacher`` on ``corpus`` into ``out``
    (its train.json), seed 0."""
    return [
        "--settings",
        json.dumps(run),
        "--teacher",
        str(teacher),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--seed",
        "0",
        "--preset",
        preset,
        "--model",
        model,
    ]


def dpo_argv(source: tuple[str, str], train, held_out, settings: dict, out, domain: str = "math") -> list[str]:
    """``ar2dlm.armap.dpo_run``'s command line: DPO of ``source`` (``("--model", folder)`` or
    ``("--manifest", train.json)``) on one preference file of ``domain``, seed 0."""
    flag, path = source
    return [
        flag,
        str(path),
        "--train",
        str(train),
        "--domains",
        domain,
        "--eval",
        str(held_out),
        "--settings",
        json.dumps(settings),
        "--seed",
        "0",
        "--out",
        str(out),
    ]


# every conventions combination the decode engine decodes: (attention, shift, block size)
GRAPHED = [("causal", True, None), ("bidirectional", False, None), ("bidirectional", True, None)]
GRAPHED += [("block", shift, bs) for shift in (False, True) for bs in (1, 4, 8)]


class GraphReplays:
    """A CPU fake of CUDA graph trees' output lifetimes, over the decode engine's steps
    (``DecodeEngine._step``), for use as a context manager. On a GPU the engine compiles each step kind
    with ``mode="reduce-overhead"``: every step is a graph replay whose outputs live in a pool that the
    next replay reuses, so a tensor a step returned is overwritten once any step runs after it (graph
    trees raise, or another step's numbers are read). Here each step's outputs are filled with NaN, in
    place and so through every view of them, as soon as the next step starts; and a step that allocates
    a cache layer (a ``StaticCache`` built without ``early_initialization``, whose tensors would be graph
    outputs the later steps mutate) is refused. ``replays`` counts the steps run."""

    def __init__(self):
        self.live: list = []
        self.replays = 0

    def __enter__(self):
        from unittest import mock

        from ar2dlm.core.engine import DecodeEngine

        real, fake = DecodeEngine._step, self

        def step(engine, kind, shape=()):
            forward = real(engine, kind, shape)

            def replay(model, ids, pos, mask, cache, keep):
                fake.overwrite()
                layers = list(cache.layers) if cache is not None else []
                empty = [layer for layer in layers if not layer.is_initialized]
                out = forward(model, ids, pos, mask, cache, keep)
                if any(layer.is_initialized for layer in empty):
                    raise RuntimeError(
                        f"step {kind!r} allocated its KV cache: under CUDA graphs those tensors are graph outputs "
                        "that later steps overwrite (build the cache with early_initialization)"
                    )
                fake.live.append(out)
                fake.replays += 1
                return out

            return replay

        self._patch = mock.patch.object(DecodeEngine, "_step", step)
        self._patch.start()
        return self

    def overwrite(self) -> None:
        """What the next replay does to the outputs of the steps before it."""
        for out in self.live:
            out.fill_(float("nan") if out.is_floating_point() else -1)
        self.live.clear()

    def __exit__(self, *exc):
        self._patch.stop()
