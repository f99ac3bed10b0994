"""The README starts with the two commands, CI runs the second one, and the pipeline timing script
adds up a resumed run."""

from tests.conftest import REPO


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    lines = (REPO / "README.md").read_text().splitlines()
    fence = lines.index("```bash")
    main_cmd, test_cmd, close = lines[fence + 1 : fence + 4]
    title, blank, sentence, blank2 = lines[:fence]
    assert (title, blank, blank2) == ("# ar2dlm", "", "") and close == "```"
    assert sentence.endswith(".") and sentence.count(". ") == 0  # one sentence on what it does
    assert "all_tables" in main_cmd and "--configfile" not in main_cmd
    assert "pytest" in test_cmd
    assert test_cmd in (REPO / ".ci" / "run").read_text()


def test_the_pipeline_timing_adds_up_the_sittings_of_a_resumed_run(tmp_path):
    """benchmarks/pipeline.py refuses a results/ it did not start from empty, and --resume
    continues a run, its wall time the sum of the sittings it records."""
    import json
    import subprocess
    import sys

    from ar2dlm.pipeline import layout

    script = [
        sys.executable,
        str(REPO / "benchmarks" / "pipeline.py"),
        "--workdir",
        str(tmp_path),
        "--configfile",
        str(REPO / "config" / "presets" / "smoke.yaml"),
        "--budget-min",
        "5",
    ]

    def run(*extra):
        return subprocess.run(script + list(extra), capture_output=True, text=True, timeout=600)

    first = run("--target", layout.suite_file("code", "eval"))
    assert first.returncode == 0, first.stderr[-2000:]
    again = run("--target", layout.tokenizer_dir())
    assert again.returncode != 0 and "holds results" in again.stderr and "--resume" in again.stderr
    resumed = run("--target", layout.tokenizer_dir(), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (tmp_path / layout.tokenizer_dir()).is_dir()
    summary = json.loads((tmp_path / layout.bench_result("pipeline")).read_text())
    assert len(summary["sittings"]) == 2 and all(s["exit"] == 0 for s in summary["sittings"])
    # the total is rounded to 0.1 s like each sitting; their float sum may differ in the last bit
    assert summary["wall_seconds"] == round(sum(s["seconds"] for s in summary["sittings"]), 1)
    assert "2 sittings" in resumed.stdout
