"""Provenance (library versions, settings) and atomic writes, so a failed job never leaves a
partial file where a finished one is expected."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path

LIBRARIES = ["ar2dlm", "torch", "transformers", "tokenizers", "datasets", "evalplus", "snakemake"]


def library_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_json(path: str | Path, obj) -> None:
    """Write JSON atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl(path: str | Path, rows) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    n = 0
    try:
        with os.fdopen(fd, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
                n += 1
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


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
