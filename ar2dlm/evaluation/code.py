"""Code evaluation: completion post-processing and scoring with the real evalplus evaluator.

evalplus reads ``HUMANEVAL_OVERRIDE_PATH`` once, at import, and 0.3.1 prompts on stdin when its
results file already exists and returns nothing. So every scoring call runs evalplus in a fresh
subprocess with its own cache folder, a fresh samples file, stdin closed, and reads the results
JSON that evalplus writes. Generated code only ever runs inside evalplus's guarded workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..provenance import write_jsonl

STOP_SEQUENCES = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", '\n"""', "\n#"]


def truncate_completion(text: str) -> str:
    """Cut a generated continuation of a function prompt down to the function body: stop at the
    first stop sequence or at the first non-empty line that is not indented."""
    for stop in STOP_SEQUENCES:
        idx = text.find(stop)
        if idx != -1:
            text = text[:idx]
    lines = text.split("\n")
    kept = []
    for i, line in enumerate(lines):
        if i > 0 and line.strip() and not line[0].isspace():
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


# evalplus.evaluate starts a non-daemon watchdog thread that sleeps 20 s, so a plain
# `python -m evalplus.evaluate` lingers 20 s after finishing; exit as soon as results are written.
_EVALPLUS_MAIN = (
    "import os, sys\n"
    "from evalplus.evaluate import evaluate\n"
    "evaluate(dataset='humaneval', samples=sys.argv[1], parallel=int(sys.argv[2]))\n"
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)\n"
)


def score_with_evalplus(problems_path: str | Path, samples: list[dict], workdir: str | Path | None = None,
                        parallel: int = 2, timeout_s: int = 1800) -> dict:
    """Score ``samples`` ({task_id, completion}) against a HumanEval+-format JSONL with evalplus.

    Returns per-task lists of (base_pass, plus_pass) and pass@k for k in (1, 10) where every task
    has at least k samples, for the base tests and for base + plus tests.
    """
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        samples_path = Path(tmp) / "samples.jsonl"
        write_jsonl(samples_path, samples)
        env = dict(os.environ, HUMANEVAL_OVERRIDE_PATH=str(Path(problems_path).resolve()),
                   XDG_CACHE_HOME=str(Path(tmp) / "cache"), TOKENIZERS_PARALLELISM="false")
        cmd = [sys.executable, "-c", _EVALPLUS_MAIN, str(samples_path), str(parallel)]
        proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
        results_path = Path(tmp) / "samples_eval_results.json"
        if proc.returncode != 0 or not results_path.is_file():
            raise RuntimeError(f"evalplus failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results = json.loads(results_path.read_text())
    per_task = {
        tid: [{"base": r["base_status"] == "pass", "plus": r["base_status"] == "pass" and r["plus_status"] == "pass"}
              for r in rows]
        for tid, rows in results["eval"].items()
    }
    n_min = min(len(v) for v in per_task.values())
    metrics = {}
    for tests in ("base", "plus"):
        for k in (1, 10):
            if n_min >= k:
                metrics[f"{tests}_pass@{k}"] = float(np.mean(
                    [pass_at_k(len(v), sum(r[tests] for r in v), k) for v in per_task.values()]))
    return {"metrics": metrics, "per_task": per_task}
