"""Wall time of a whole target from a clean results directory, and where the time goes.

    python benchmarks/pipeline.py --workdir /tmp/tiny_run [--configfile config/presets/smoke.yaml] [--cores 2]
    python benchmarks/pipeline.py --workdir . --no-run      # only read an existing run's benchmark files
    python benchmarks/pipeline.py --workdir /tmp/full_run --configfile config/presets/tiny_full.yaml \
        --target "all_tables bench" --budget-min 240 [--resume]

Runs ``snakemake <target>`` (default all_tables) in ``--workdir`` (which must hold no results/ yet)
and times it, then reads the per-job files Snakemake's ``benchmark:`` directive wrote under
results/benchmarks/ and prints, as Markdown: the wall time against the budget, the summed job
seconds and CPU seconds per stage, and the slowest jobs. Writes the same as JSON (--out).

A run longer than one sitting may be stopped (Ctrl-C, SIGTERM) and continued with ``--resume``:
each sitting's wall time is kept in results/bench/pipeline_sittings.json, the jobs that were
running are redone (``--rerun-incomplete``), and the wall time reported is the sum of the sittings.
"""

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from ar2dlm.pipeline import layout

REPO = Path(__file__).resolve().parents[1]


def job_times(work: Path) -> pd.DataFrame:
    """One row per job: stage (the benchmark folder), job, wall seconds, CPU seconds, peak RSS (MB)."""
    rows = []
    for f in sorted(work.glob(layout.bench_path("*/*"))):
        last = pd.read_csv(f, sep="\t").iloc[-1]
        rows.append(
            {
                "stage": f.parent.name,
                "job": f.stem,
                "s": float(last["s"]),
                "cpu_s": float(last["cpu_time"]),
                "max_rss_mb": float(last["max_rss"]),
            }
        )
    if not rows:
        raise SystemExit(f"no benchmark files {work / layout.bench_path('*/*')}: run the target first")
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="where results/ is written (must have none unless --no-run)")
    ap.add_argument("--target", default="all_tables", help="one or more targets, space separated")
    ap.add_argument("--configfile", default=None, help="a preset or override file (default: the embedded tiny preset)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--budget-min", type=float, default=45.0)
    ap.add_argument("--no-run", action="store_true", help="only summarise the benchmark files already there")
    ap.add_argument("--resume", action="store_true", help="continue a run this script started and was stopped")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=None, help="JSON summary (default: <workdir>/results/bench/pipeline.json)")
    args = ap.parse_args()

    work = Path(args.workdir).resolve()
    results = work / layout.RESULTS
    sittings_file = work / layout.bench_result("pipeline_sittings")
    wall = None
    if not args.no_run:
        fresh = not (results.exists() and any(p.name != "README.md" for p in results.iterdir()))
        if not fresh and not args.resume:
            raise SystemExit(
                f"{results} holds results: the timing is from a clean results directory (move them away "
                "first, or --resume a stopped run)"
            )
        if args.resume and not sittings_file.exists():
            raise SystemExit(f"--resume: no {sittings_file} (this directory holds no run started by this script)")
        sittings = json.loads(sittings_file.read_text()) if args.resume else []
        work.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            *args.target.split(),
            "--cores",
            str(args.cores),
        ]
        if args.configfile:
            cmd += ["--configfile", str(Path(args.configfile).resolve())]
        if args.resume:
            subprocess.run(cmd + ["--unlock"], cwd=work, check=True, capture_output=True)
            cmd += ["--rerun-incomplete"]
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=work)

        # Snakemake stops its jobs and exits
        def stop(*_):
            return proc.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        returncode = proc.wait()
        sittings.append(
            {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0)),
                "seconds": round(time.time() - t0, 1),
                "exit": returncode,
            }
        )
        sittings_file.parent.mkdir(parents=True, exist_ok=True)
        sittings_file.write_text(json.dumps(sittings, indent=2))
        wall = sum(x["seconds"] for x in sittings)
        if returncode != 0:
            raise SystemExit(
                f"snakemake {args.target} stopped (exit {returncode}) after {wall:.0f} s in "
                f"{len(sittings)} sitting(s); continue it with --resume"
            )

    jobs = job_times(work)
    stages = (
        jobs.groupby("stage")
        .agg(jobs=("job", "size"), job_s=("s", "sum"), cpu_s=("cpu_s", "sum"), slowest_s=("s", "max"))
        .sort_values("job_s", ascending=False)
        .round(1)
    )
    slowest = jobs.sort_values("s", ascending=False).head(args.top).round(1)
    sittings = json.loads(sittings_file.read_text()) if sittings_file.exists() else []
    summary = {
        "target": args.target,
        "configfile": args.configfile,
        "cores": args.cores,
        "wall_seconds": None if wall is None else round(wall, 1),
        "sittings": sittings,
        "budget_minutes": args.budget_min,
        "jobs": len(jobs),
        "job_seconds": round(jobs.s.sum(), 1),
        "cpu_seconds": round(jobs.cpu_s.sum(), 1),
        "stages": stages.reset_index().to_dict("records"),
        "slowest": slowest.to_dict("records"),
    }
    out = Path(args.out) if args.out else work / layout.bench_result("pipeline")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))

    if wall is not None:
        verdict = "within" if wall <= 60 * args.budget_min else "over"
        parts = f" in {len(sittings)} sittings" if len(sittings) > 1 else ""
        print(
            f"{args.target}: {wall / 60:.1f} min wall{parts} on {args.cores} cores ({verdict} the "
            f"{args.budget_min:g}-minute budget)"
        )
    print(f"{len(jobs)} jobs, {jobs.s.sum() / 60:.1f} job-minutes, {jobs.cpu_s.sum() / 60:.1f} CPU-minutes\n")
    print(stages.to_markdown(), "\n")
    print(slowest.to_markdown(index=False))


if __name__ == "__main__":
    main()
