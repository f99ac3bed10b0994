"""Record the AR teacher's headline score on every benchmark of a preset, from a run's results.

    python benchmarks/teacher_scores.py RESULTS_DIR [--preset tiny] [--out docs/tiny/teacher_scores.json]

The claims report calls a benchmark the teacher scores below ``TEACHER_FLOOR`` uninformative;
``tests/test_config.py`` checks, against this record, that the tiny preset's claims read benchmarks
the tiny teacher can do. Rerun it after changing the tiny teacher or its benchmarks.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a finished run's results/ folder")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "tiny" / "teacher_scores.json")
    a = ap.parse_args()
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve
    from ar2dlm.provenance import read_json, write_json

    if not a.results.is_dir():
        raise SystemExit(f"{a.results} is not a folder: give a finished run's results/ folder")
    resolved = resolve(merge_preset({"preset": a.preset}, REPO / "config"))
    config = resolved.config
    os.chdir(a.results.parent)  # result paths are relative to the run's working directory
    from ar2dlm.pipeline import layout

    scores, provenance = {}, {}
    for model in config["models"]:
        for bench in config["eval"]["benchmarks"]:
            path = Path(layout.eval_path(bench, model, "teacher"))
            if not path.exists():
                continue
            res = read_json(path)
            scores[bench] = {
                "metric": resolved.benchmarks[bench].headline_metric,
                "value": round(resolved.benchmarks[bench].headline_value(res), 4),
            }
            provenance = {"commit": res.get("provenance", {}).get("commit"), "machine": res["versions"].get("machine")}
    if not scores:  # never writes an empty record over the one kept
        raise SystemExit(f"{a.results} holds no teacher evaluation of preset {a.preset}: {a.out} left as it is")
    write_json(a.out, {"preset": a.preset, "teacher_scores": scores, **provenance})
    print(f"{a.out}: {len(scores)} benchmarks")


if __name__ == "__main__":
    main()
