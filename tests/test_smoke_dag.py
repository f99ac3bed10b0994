"""The smoke preset runs all_tables to the end in a temporary directory."""

import json

import pytest

from tests.conftest import REPO, run_snakemake

SMOKE = str(REPO / "config" / "presets" / "smoke.yaml")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    proc = run_snakemake(["all_tables", "--configfile", SMOKE, "--cores", "2"], workdir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return workdir


def test_every_artifact_exists_and_is_non_empty(smoke_run):
    results = smoke_run / "results"
    expected = [
        "data/code/train.jsonl", "data/code/eval.jsonl", "data/math/train.jsonl", "data/math/eval.jsonl",
        "data/preferences/code/train.jsonl", "data/preferences/math/eval.jsonl",
        "data/tokenizer/tokenizer.json", "data/corpus/subset.jsonl", "data/corpus/stream.jsonl",
        "data/corpus/manifest.json", "models/tiny/teacher/config.json", "models/tiny/teacher/model.safetensors",
        "models/tiny/teacher/ar2dlm.json", "logs/teacher/tiny_loss.csv", "eval/synthetic_code/tiny/teacher.json",
        "models/tiny/opd_ra/seed0/train.json", "models/tiny/ed/seed0/step_4/model.safetensors",
        "models/tiny/ed/seed0/step_4/ar2dlm.json", "models/tiny/ed/seed0/log.jsonl",
        "summary.md", "summary.json",
    ]
    for rel in expected:
        assert (results / rel).is_file() and (results / rel).stat().st_size > 0, rel


def test_summary_reports_measured_teacher_numbers(smoke_run):
    summary = json.loads((smoke_run / "results" / "summary.json").read_text())
    assert summary["preset"] == "smoke"
    (teacher,) = summary["teachers"]
    assert 0.0 <= teacher["pass@1 (base)"] <= 1.0 and teacher["held-out loss (code)"] > 0
    ev = json.loads((smoke_run / "results" / "eval" / "synthetic_code" / "tiny" / "teacher.json").read_text())
    assert ev["n_tasks"] == 16 and len(ev["samples"]) == 16 and "transformers" in ev["versions"]
    provenance = json.loads((smoke_run / "results" / "models" / "tiny" / "teacher" / "ar2dlm.json").read_text())
    assert provenance["seed"] == 0 and provenance["data"]["steps"] == 20 and provenance["attention"] == "causal"


def test_second_run_has_nothing_to_do(smoke_run):
    proc = run_snakemake(["-n", "all_tables", "--configfile", SMOKE], smoke_run)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr


def test_decode_benchmark_rule(smoke_run):
    proc = run_snakemake(["bench", "--configfile", SMOKE, "--cores", "2"], smoke_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = json.loads((smoke_run / "results" / "bench" / "decode.json").read_text())
    assert set(bench["ratios"]["dlm_cached_over_ar_tokens_per_s"]) == {"0.5", "1.0"}
    assert bench["ratios"]["cached_over_uncached_speed"]["32"] > 0
    (one,) = [r for r in bench["dlm_thresholds"] if r["threshold"] == 1.0]
    assert one["tokens_per_step"] == 1.0 and one["decoded"] == 2 * 32
    assert bench["converted_dlm"] is True and bench["model"].endswith("ed_long/seed0/step_8")
    assert bench["ar_model"].endswith("models/tiny/teacher") and bench["tasks"]["prompts"] == 2
    assert {r["threshold"] for r in bench["tasks"]["dlm"]} == {0.5, 1.0}
    train = json.loads((smoke_run / "results" / "bench" / "train.json").read_text())
    assert set(train["runs"]) == {"mdlm", "ra", "ra_freeze"} and train["freeze_speedup"] > 0
    assert len(train["wall_seconds"]) == 24 and "no CUDA" in train["gpu"]
