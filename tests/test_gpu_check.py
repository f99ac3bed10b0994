"""benchmarks/gpu_check.py on a CPU: every check reported and passed (SKIP only where a CPU cannot run
it), and a check whose comparison is perturbed fails the script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402


def run_check(tmp_path, *args):
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
            "--budget-s",
            "1800",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        env=gpu_check.subprocess_env(),
    )
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def statuses(report) -> dict:
    return {c["check"]: c["status"] for c in report["checks"]}


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    """One CPU run of the whole check, read by the tests below."""
    return run_check(tmp_path_factory.mktemp("gpu_check"))


def test_every_check_runs_on_a_cpu_and_passes(cpu_check):
    proc, report = cpu_check
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    got = statuses(report)
    assert list(got) == gpu_check.check_names("cpu", True)
    cannot = {c for s in gpu_check.stages("cpu", True) if s.cpu_skip for c in s.checks}
    assert cannot == {"flex_vs_dense_efficient_dlm", "flex_vs_dense_mdlm"}
    assert {c for c, status in got.items() if status == "SKIP"} == cannot
    assert all(status == "PASS" for c, status in got.items() if c not in cannot), got
    assert report["passed"] and "| decode_block_cache | PASS |" in proc.stdout  # the table printed at the end
    measured = {c["check"]: c["measured"] for c in report["checks"]}
    assert "resumed from 2" in measured["resume_losses"] and "planner" in measured["memory_efficient_dlm"]


def test_every_comparison_fails_when_what_it_compares_is_altered(cpu_check):
    """Every check that compares values was judged again on its value altered, and failed there (the same
    run passed on the measured values); only the checks named as comparing no value were not."""
    _, report = cpu_check
    altered = {c["check"]: c["altered"] for c in report["checks"]}
    cannot = {c for s in gpu_check.stages("cpu", True) if s.cpu_skip for c in s.checks}
    comparing = set(altered) - cannot - set(gpu_check.COMPARES_NO_VALUE)
    assert {c for c, verdict in altered.items() if verdict} == comparing, altered
    assert all(altered[c] == "FAIL" for c in comparing), altered
    assert not report["perturbed"]  # no --inject-failure: the statuses are the measured values' verdicts


def judged(inject, compare):
    ctx = gpu_check.Context("cpu", True, Path("."), 60.0, inject)
    ctx.judge("loss", 2.0, compare, "within 1% of 2")
    return ctx.results["loss"], ctx.perturbed


def test_a_comparison_that_passes_an_altered_value_fails_and_inject_failure_reports_the_altered_verdict():
    sound = judged(None, lambda v: (abs(v - 2.0) <= 0.02, f"loss {v}"))
    assert (sound[0].status, sound[0].altered, sound[1]) == ("PASS", "FAIL", set())
    blind = judged(None, lambda v: (v > 0, f"loss {v}"))  # passes 2 and 4 alike
    assert (blind[0].status, blind[0].altered) == ("FAIL", "PASS")
    assert "passes an altered value too (loss 4.0)" in blind[0].measured
    injected = judged("all", lambda v: (abs(v - 2.0) <= 0.02, f"loss {v}"))
    assert (injected[0].status, injected[0].measured, injected[1]) == ("FAIL", "loss 4.0", {"loss"})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cuda", "--inject-failure", "nothing"], None),
        (["--device", "cpu", "--inject-failure", "no_such_check"], "no such check"),
    ],
)
def test_refuses_before_any_work(tmp_path, monkeypatch, capsys, argv, message):
    """A missing package (or CUDA device) and an unknown check stop it with exit 2, naming the problem."""
    for name in ("CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "")  # main sets them; restored after the test
    monkeypatch.setattr(
        gpu_check, "REQUIRED", gpu_check.REQUIRED + (("no_such_package_here",) if message is None else ())
    )
    assert gpu_check.main([*argv, "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert (message or "lacks no_such_package_here; this check installs nothing") in err
    assert not (tmp_path / "w").exists()


def test_a_stage_that_raises_fails_its_unreported_checks_and_the_others_run(tmp_path):
    ctx = gpu_check.Context("cpu", True, tmp_path, 60.0, None)

    def broken(c):
        c.expect("first", True, "1", "reported before the error")
        raise RuntimeError("torchrun failed (exit 1):\nTraceback ...\nValueError: the last line")

    gpu_check.run_stage(ctx, gpu_check.Stage("broken", ("first", "second"), broken))
    gpu_check.run_stage(ctx, gpu_check.Stage("needs", ("third",), lambda c: c.need("teacher")))
    gpu_check.run_stage(ctx, gpu_check.Stage("gpu", ("fourth",), broken, cpu_skip="no CPU backward"))
    ctx.budget_s = 0.0
    gpu_check.run_stage(ctx, gpu_check.Stage("late", ("fifth",), broken))
    got = {name: (r.status, r.criterion) for name, r in ctx.results.items()}
    assert got["first"] == ("PASS", "reported before the error")
    assert got["second"] == ("FAIL", "RuntimeError: torchrun failed (exit 1): ... ValueError: the last line")
    assert got["third"] == ("FAIL", "not run: needs teacher: an earlier stage did not produce it")
    assert got["fourth"] == ("SKIP", "not on a CPU: no CPU backward")
    assert got["fifth"][0] == "FAIL" and "time budget" in got["fifth"][1]


def test_only_runs_the_stages_asked_for_and_those_they_read_from():
    names = [s.name for s in gpu_check.selected(gpu_check.stages("cuda", False), ["gamma"])]
    assert names == ["train", "dpo", "gamma"]
    assert [s.name for s in gpu_check.selected(gpu_check.stages("cuda", False), ["memory"])] == ["memory"]


def test_an_importable_but_broken_vllm_gives_a_skip_line(tmp_path, monkeypatch):
    import importlib.util
    import types

    real = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # imports, and has no LLM
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    ctx = gpu_check.Context("cuda", True, tmp_path, 60.0, None)
    rate, note = gpu_check.vllm_tokens_per_s(ctx, None, [11, 12], 4)
    assert rate is None and note.startswith("vLLM skipped: installed but unusable here (ImportError")
