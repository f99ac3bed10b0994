"""Provenance (library versions, settings) and atomic writes, so a failed job never leaves a
partial file where a finished one is expected."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import platform
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

LIBRARIES = ["ar2dlm", "torch", "transformers", "tokenizers", "datasets", "evalplus", "snakemake"]


def library_versions(dtype: str | None = None) -> dict:
    """Library versions, and the machine facts a CPU result depends on (``machine``), with the
    dtype the job computed in (``dtype: auto`` resolved on this machine) when it has one."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["machine"] = machine() if dtype is None else {**machine(), "dtype": dtype}
    return out


def machine() -> dict:
    """What makes the same seed give other numbers on another CPU: the processor, the vector
    instructions torch dispatches its kernels to (AVX2, AVX512; bf16 matrix products differ with
    avx512_bf16 and AMX), and the threads a reduction is split over."""
    import torch

    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())  # the first processor's lines
    except OSError:
        pass
    flags = set(info.get("flags", "").split())
    return {
        "cpu": info.get("model name", platform.processor()),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "bf16_instructions": sorted(flags & {"avx512_bf16", "amx_bf16"}),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


SOURCE_ROOT = Path(__file__).resolve().parents[1]
UNRECORDED = ("weights_sha256", "versions", "wall_seconds", "log", "provenance")  # not settings: results, timings


@functools.cache
def code_commit() -> str:
    """The git commit of the source tree this package runs from, ``+modified`` when tracked files
    differ from it; ``unknown`` outside a git checkout (an installed wheel records its version)."""

    def git(*args):
        return subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+modified" if dirty else "")


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` over ``base``, nested dicts merged key by key (settings over their defaults)."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def settings_hash(settings) -> str:
    """sha256 (first 12 hex digits) of settings as canonical JSON, leaving out recorded results,
    timings and file hashes (``UNRECORDED``)."""
    if isinstance(settings, dict):
        settings = {k: v for k, v in settings.items() if k not in UNRECORDED}
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _atomic_write(path: str | Path, write) -> None:
    """Call ``write(file)`` on a temp file in the target's folder, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def non_finite(obj, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in ``obj`` (dicts, lists, floats), else None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else where or "the value"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        found = non_finite(v, f"{where}.{k}" if where and isinstance(k, str) else f"{where}[{k}]" if where else str(k))
        if found:
            return found
    return None


def _refuse_non_finite(path, obj, what: str = "") -> None:
    where = non_finite(obj)
    if where:
        raise ValueError(f"{what}{where} is not a finite number; JSON has no NaN or Infinity, so {path} is not written")


def write_json(path: str | Path, obj) -> None:
    """Write JSON atomically; a NaN or infinity anywhere fails, naming its key, before anything is written."""
    _refuse_non_finite(path, obj)
    _atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, default=str, allow_nan=False) + "\n"))


def write_jsonl(path: str | Path, rows) -> int:
    """Write one JSON object per line atomically (no NaN or infinity); return the number of rows."""
    rows = list(rows)
    for i, row in enumerate(rows):
        _refuse_non_finite(path, row, f"row {i + 1}: ")
    _atomic_write(path, lambda f: f.writelines(json.dumps(row, allow_nan=False) + "\n" for row in rows))
    return len(rows)


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file; a line that is not JSON fails naming the file and line."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}, line {n}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    return rows


def read_json(path: str | Path):
    with open(path) as f:
        return json.load(f)


def log_to(path: str | Path, threads: int | None = None) -> None:
    """Send this process's stdout and stderr (progress bars included) to a job's log file, and
    give torch the job's threads (Snakemake scales ``threads`` down to ``--cores``)."""
    import sys

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout = sys.stderr = open(path, "w", buffering=1)
    if threads:
        import torch

        torch.set_num_threads(threads)
