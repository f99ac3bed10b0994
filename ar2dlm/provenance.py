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


def write_json(path: str | Path, obj) -> None:
    """Write JSON atomically."""
    _atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, default=str) + "\n"))


def write_jsonl(path: str | Path, rows) -> int:
    """Write one JSON object per line atomically; return the number of rows."""
    rows = list(rows)
    _atomic_write(path, lambda f: f.writelines(json.dumps(row) + "\n" for row in rows))
    return len(rows)


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
