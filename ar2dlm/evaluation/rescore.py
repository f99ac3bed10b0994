"""Rescore lm-eval's logged code responses with evalplus's checks, each program in the sandbox:

    python -m ar2dlm.evaluation.rescore OUT_DIR_OR_SAMPLES_JSONL --problems PROBLEMS.jsonl [--out scores.json]

Reads lm-eval's ``samples_<task>_*.jsonl`` (``--log_samples``; ``code_completion`` or lm-eval's own
``humaneval``), matches each response to its problem by ``task_id``, cuts it to the function body as
the pipeline's code evaluations do, and scores it against a HumanEval+-format file (``base_input`` /
``plus_input``: evalplus's oracle, base and plus tests) or a HumanEval-format one (``test``). Prints
pass@k and writes the scores, per task, as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .code import CodeScoring, postprocess, read_problems, score_samples


def logged_samples(path: str | Path) -> list[dict]:
    """lm-eval's logged records: a samples file, or every ``samples_*.jsonl`` under a folder (one task's)."""
    path = Path(path)
    files = sorted(path.rglob("samples_*.jsonl")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no lm-eval samples file (samples_<task>_*.jsonl, --log_samples) at {path}")
    tasks = {f.name.rsplit("_", 1)[0] for f in files}
    if len(tasks) > 1:
        raise ValueError(f"{path} holds the samples of several tasks ({', '.join(sorted(tasks))}): name one file")
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def rescore(records: list[dict], problems_path: str | Path, parallel: int = 2) -> dict:
    """Every response of ``records`` scored against the problems file: metrics and per-task verdicts."""
    problems = {p["task_id"]: p for p in read_problems(problems_path)}
    fmt = "evalplus" if "base_input" in next(iter(problems.values())) else "humaneval"
    samples = []
    for r in records:
        task_id = r["doc"]["task_id"]
        if task_id not in problems:
            raise KeyError(f"{task_id} is not a problem of {problems_path}")
        for text in r["resps"][0]:  # the raw responses (lm-eval's humaneval filter prepends the prompt)
            samples.append(postprocess(problems[task_id], text, "body"))
    scored = score_samples(problems_path, samples, CodeScoring(fmt=fmt, parallel=parallel))
    return {"format": fmt, "n_samples": len(samples), **scored}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", help="lm-eval's --output_path folder, or one samples_<task>_*.jsonl file")
    ap.add_argument("--problems", required=True, help="the problems, HumanEval+ or HumanEval format (.jsonl[.gz])")
    ap.add_argument("--parallel", type=int, default=2, help="sandboxes at once")
    ap.add_argument("--out", help="write the scores and per-task verdicts here (JSON)")
    args = ap.parse_args(argv)
    if not Path(args.problems).is_file():
        sys.exit(f"--problems {args.problems}: no such file")
    try:
        records = logged_samples(args.samples)
        result = rescore(records, args.problems, args.parallel)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        sys.exit(str(exc))
    print(json.dumps({"format": result["format"], "n_samples": result["n_samples"], **result["metrics"]}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
