"""Wall time of scoring an evaluation's samples in the sandbox, and its verdicts, to compare two
versions of the sandbox on the same samples.

    python benchmarks/sandbox_scoring.py results/eval/teacher_check/tiny.json --out /tmp/new.json
    PYTHONPATH=/path/to/other/checkout python benchmarks/sandbox_scoring.py ... --out /tmp/old.json
    python benchmarks/sandbox_scoring.py ... --compare /tmp/old.json     # times again, counts differing verdicts

Reads the samples of the evaluation JSON (inline in the teacher check, else ``.samples.jsonl``
beside it) and the problems file (the teacher check's ``code_eval``, else ``--problems``),
scores them ``--repeats`` times with the evaluation's own format and parallelism, and prints the
median wall time and how many verdicts differ from ``--compare``.
"""

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evaluation", type=Path, help="an evaluation JSON of a code benchmark (its samples beside it)")
    ap.add_argument("--problems", type=Path, default=None, help="the problems file (default: what the JSON names)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--compare", type=Path, default=None, help="verdicts written by another run of this script")
    a = ap.parse_args()
    from ar2dlm.evaluation import code
    from ar2dlm.provenance import read_json, read_jsonl

    result = read_json(a.evaluation)
    settings = result["settings"]
    rows = result.get("samples") or read_jsonl(a.evaluation.with_suffix(".samples.jsonl"))
    samples = [{"task_id": s["task_id"], "completion": s["completion"]} for s in rows]
    problems = a.problems or Path(result["code_eval"])  # the teacher check's held-out suite
    times, scored = [], None
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        scored = code.score_samples(
            problems,
            samples,
            code.CodeScoring(
                fmt=settings.get("format", "evalplus"),
                dataset=settings.get("dataset", "humaneval"),
                parallel=settings.get("parallel", 2),
            ),
        )
        times.append(time.perf_counter() - t0)
    verdicts = {tid: rows for tid, rows in sorted(scored["per_task"].items())}
    line = (
        f"{len(samples)} samples scored in {statistics.median(times):.2f} s (median of {a.repeats}: "
        f"{', '.join(f'{t:.2f}' for t in times)}), {code.__file__}"
    )
    if a.compare:
        other = json.loads(a.compare.read_text())["verdicts"]
        differ = sum(x != y for tid in verdicts for x, y in zip(verdicts[tid], other.get(tid, [])))
        line += f"; {differ} of {len(samples)} verdicts differ from {a.compare}"
    print(line)
    if a.out:
        a.out.write_text(json.dumps({"seconds": times, "verdicts": verdicts}))


if __name__ == "__main__":
    main()
