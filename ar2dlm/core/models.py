"""Model folders: build a small Qwen3 from config, resolve a pretrained checkpoint (hub or local
path, with a clear error offline), save/load HF folders with the DLM conventions JSON beside the
weights, and find a training run's checkpoint folders (``step_<k>/``). Decoding conventions are
always read from that JSON, never guessed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

from ..provenance import read_json, write_json
from .conventions import Conventions

CONVENTIONS_FILE = "ar2dlm.json"
WEIGHT_HASHES = "weights_sha256"  # key of the conventions JSON: {weight file: sha256} as written
_VERIFIED: set[tuple] = set()  # weight files this process has checked, with their size and time


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found or downloaded."""


def build_qwen3(arch: dict, tokenizer):
    """A randomly initialised Qwen3 causal LM at the width in ``arch`` and the tokenizer's vocabulary."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=arch["num_hidden_layers"],
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_key_value_heads"],
        head_dim=arch["hidden_size"] // arch["num_attention_heads"],
        max_position_embeddings=arch["max_position_embeddings"],
        tie_word_embeddings=arch.get("tie_word_embeddings", True),
        rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(arch.get("init_seed", 0))
    return Qwen3ForCausalLM(cfg)


def resolve_pretrained(
    hub_id: str | None,
    model_path: str | None,
    revision: str | None = None,
    local_key: str = "`model_path:` of this model",
) -> str:
    """Return a local folder holding the checkpoint: ``model_path`` if given, else a hub snapshot.

    Offline (or with the hub unreachable) this fails at once, naming the model and how to point
    at a local copy, before any other work starts.
    """
    if model_path:
        p = Path(model_path)
        if not (p / "config.json").is_file():
            raise CheckpointError(f"model_path {model_path!r} is not a Hugging Face model folder (no config.json)")
        return str(p)
    if not hub_id:
        raise CheckpointError("a pretrained model needs hub_id or model_path in its config entry")
    from huggingface_hub import snapshot_download

    from .hub import MODEL_FILES, HubAsset, missing_message

    try:  # from the cache when the hub is offline (compute jobs), else downloaded
        return snapshot_download(hub_id, revision=revision, allow_patterns=list(MODEL_FILES), etag_timeout=10)
    except Exception as exc:  # huggingface_hub raises several types for offline / unreachable / gated
        raise CheckpointError(
            f"cannot read {hub_id!r} ({type(exc).__name__}: {str(exc)[:200]}).\n"
            + missing_message([HubAsset(hub_id, "model", revision, (local_key,))])
            + f"\nOr point {local_key} at a local copy."
        ) from exc


def save_model(model, tokenizer, out_dir: str | Path, conventions: dict, state_dict: dict | None = None) -> None:
    """An HF folder with the conventions JSON beside the weights, recording each weight file's
    sha256 (``state_dict``: the weights to write instead of the model's own, e.g. a sharded model's
    consolidated state)."""
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir), state_dict=state_dict)
    tokenizer.save_pretrained(str(out_dir))
    hashes = {f.name: file_sha256(f) for f in sorted(out_dir.glob("*.safetensors"))}
    write_json(out_dir / CONVENTIONS_FILE, {**conventions, WEIGHT_HASHES: hashes})


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 23), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_weights(model_dir: str | Path, info: dict | None = None) -> None:
    """Each weight file of a folder this project wrote against the sha256 recorded when it was
    written (a truncated or altered file fails naming it). Pretrained folders record none."""
    info = load_conventions(model_dir) if info is None else info
    for name, digest in (info.get(WEIGHT_HASHES) or {}).items():
        path = Path(model_dir) / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing (its {CONVENTIONS_FILE} records it)")
        stat = path.stat()
        seen = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, digest)
        if seen in _VERIFIED:  # a job that reads a folder twice (streamed, then loaded) hashes it once
            continue
        if file_sha256(path) != digest:
            raise CheckpointError(
                f"{path} does not match the sha256 recorded when it was written: it is truncated or corrupt"
            )
        _VERIFIED.add(seen)


def check_finite(model, model_dir: str | Path) -> None:
    """Refuse weights holding NaN or infinity, naming the tensor and the folder."""
    import torch

    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{model_dir}: tensor {name} holds NaN or infinite values")


def load_conventions(model_dir: str | Path) -> dict:
    path = Path(model_dir) / CONVENTIONS_FILE
    if not path.is_file():
        raise CheckpointError(f"{model_dir} has no {CONVENTIONS_FILE}: its decoding conventions are unknown")
    return read_json(path)


def checkpoint_dir(run_dir, step) -> Path:
    """One checkpoint of a training run (``run_dir`` holds the run's manifest, ``train.json``)."""
    return Path(run_dir) / f"step_{step}"


def checkpoint_dirs(run_dir) -> dict[int, Path]:
    """The checkpoint folders a run folder holds, by step (complete or not)."""
    return {int(p.name[5:]): p for p in Path(run_dir).glob("step_*") if p.is_dir() and p.name[5:].isdigit()}


def final_checkpoint(manifest) -> Path:
    """The last checkpoint of a finished run, from its manifest (train.json)."""
    return checkpoint_dir(Path(manifest).parent, read_json(manifest)["steps"])


class FolderWeights:
    """A model folder's weights read one tensor at a time from its safetensors files (one file or
    an index of shards), memory-mapped by safetensors: task vectors, spectra and merges of an 8B
    model then hold a few tensors in host memory, never the model. Names are the files' own (a
    tied ``lm_head`` is stored once, as the embedding)."""

    def __init__(self, model_dir: str | Path):
        from safetensors import safe_open

        self.dir = Path(model_dir)
        if (self.dir / CONVENTIONS_FILE).is_file():
            verify_weights(self.dir)
        index, single = self.dir / "model.safetensors.index.json", self.dir / "model.safetensors"
        if index.is_file():
            shards = sorted({self.dir / f for f in read_json(index)["weight_map"].values()})
        elif single.is_file():
            shards = [single]
        else:
            raise CheckpointError(f"{self.dir} has no model.safetensors or model.safetensors.index.json")
        files, self.shapes = {}, {}
        for file in shards:  # one read of each header: names and shapes
            with safe_open(file, "pt") as f:
                for name in f.keys():
                    files[name], self.shapes[name] = file, tuple(f.get_slice(name).get_shape())
        self.files = dict(sorted(files.items()))

    def names(self) -> list[str]:
        return list(self.files)

    def __getitem__(self, name: str):
        from safetensors import safe_open

        with safe_open(self.files[name], "pt") as f:
            t = f.get_tensor(name)
        if t.is_floating_point() and not bool(t.isfinite().all()):
            raise CheckpointError(f"{self.files[name]}: tensor {name} holds NaN or infinite values")
        return t

    def check_matches(self, other: FolderWeights) -> None:
        """Raise, naming the first differences, unless both folders hold the same tensor names and shapes."""
        if self.shapes != other.shapes:
            diff = sorted(n for n in set(self.shapes) | set(other.shapes) if self.shapes.get(n) != other.shapes.get(n))
            raise ValueError(
                f"{self.dir} and {other.dir} differ in weights: "
                + ", ".join(f"{n} {self.shapes.get(n)} vs {other.shapes.get(n)}" for n in diff[:5])
            )


class LoadedModel(NamedTuple):
    model: object
    tokenizer: object
    conventions: Conventions  # how to decode it
    info: dict  # the whole JSON beside the weights: conventions and provenance


def device_problem(planned_gpus: int = 0, env=None, visible: int | None = None) -> str | None:
    """Why this process cannot have the GPU its job was given, before it falls back to the CPU (gloo and
    emulated bf16, many times slower) or two processes share a GPU: SLURM granted the job step GPUs on
    this node (or names devices in CUDA_VISIBLE_DEVICES), or a SLURM job's plan launches it on GPUs, and
    torch sees none (a CPU build of torch, a node without the driver); or torchrun starts more processes
    on this node than it sees GPUs. Outside SLURM a plan's processes may run on CPUs by choice (the
    stand-in DAG rehearses the paper's launches so). ``env`` and ``visible`` (the CUDA devices torch
    sees) default to this process's."""
    import torch

    env = os.environ if env is None else env
    visible = torch.cuda.device_count() if visible is None else visible
    seen = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {visible} CUDA device(s)" + (
        f", CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}" if "CUDA_VISIBLE_DEVICES" in env else ""
    )
    slurm = env.get("SLURM_GPUS_ON_NODE") or (len(env["SLURM_JOB_GPUS"].split(",")) if env.get("SLURM_JOB_GPUS") else 0)
    if visible == 0 and int(slurm):
        return f"SLURM granted this job {slurm} GPU(s) on this node (SLURM_GPUS_ON_NODE / SLURM_JOB_GPUS), and {seen}"
    if visible == 0 and env.get("CUDA_VISIBLE_DEVICES", "").strip(", "):
        return f"this job is given CUDA devices {env['CUDA_VISIBLE_DEVICES']!r}, and {seen}"
    if visible == 0 and planned_gpus and "SLURM_JOB_ID" in env:
        return f"the plan launches this run on {planned_gpus} GPU(s), and {seen}"
    local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    if visible and local_world > visible:
        return f"torchrun starts {local_world} processes on this node (LOCAL_WORLD_SIZE), one per GPU, and {seen}"
    return None


def triton_problem(env=None, which=None, find_library=None) -> str | None:
    """Why Triton cannot build kernels on this node, which a job on a GPU needs before any work (flex
    attention and ``torch.compile`` generate Triton kernels there): Triton compiles each kernel's launcher
    with a C compiler (``CC``, else cc, gcc or clang on the PATH) and links it against the driver's
    ``libcuda.so`` (``TRITON_LIBCUDA_PATH``, else the linker's cache). ``env``, ``which`` and
    ``find_library`` default to this process's."""
    import ctypes.util
    import shutil

    env = os.environ if env is None else env
    which, find_library = which or shutil.which, find_library or ctypes.util.find_library
    compilers = [env["CC"]] if env.get("CC") else ["cc", "gcc", "clang"]
    if not any(which(c) for c in compilers):
        named = f"CC={compilers[0]!r}" if env.get("CC") else "cc, gcc or clang"
        return f"Triton cannot build kernels here: no C compiler ({named}) on the PATH; load one (e.g. a gcc module)"
    if not (env.get("TRITON_LIBCUDA_PATH") or find_library("cuda")):
        return (
            "Triton cannot build kernels here: libcuda.so (the driver's library) is neither in the linker's cache "
            "nor named by TRITON_LIBCUDA_PATH"
        )
    return None


def require_triton(device) -> None:
    """Stop a job bound for a CUDA ``device`` before any work when Triton cannot build kernels here."""
    if getattr(device, "type", device) == "cuda" and (problem := triton_problem()):
        raise RuntimeError(problem)


DEVICES = ("auto", "cpu", "cuda")  # the config's device values (auto: the job's GPU when it has one)


def resolve_device(device: str | None = "auto"):
    """The torch device a job runs its model on: ``auto`` (or None) is the first GPU the job sees
    (SLURM sets CUDA_VISIBLE_DEVICES to the GPUs it granted) and the CPU without one."""
    import torch

    if device in (None, "auto"):
        if problem := device_problem():
            raise RuntimeError(f"no GPU for this job: {problem}")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r} (known: {', '.join(DEVICES)})")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "device: cuda is configured but this job sees no CUDA device (check the job's GPU "
            "request and CUDA_VISIBLE_DEVICES, or set device: auto)"
        )
    require_triton(device)
    return torch.device(device)


def load_model(model_dir: str | Path, dtype=None, device: str | None = "auto") -> LoadedModel:
    """Load model, tokenizer and decoding conventions from a folder this project wrote, on
    ``device`` (see :func:`resolve_device`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(model_dir).is_dir():
        raise CheckpointError(f"missing checkpoint folder {model_dir}")
    info = load_conventions(model_dir)
    conv = Conventions.from_dict(info)
    verify_weights(model_dir, info)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs).to(resolve_device(device))
    check_finite(model, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return LoadedModel(model, tokenizer, conv, info)
