"""The smoke preset runs all_tables to the end in a temporary directory."""

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO, SNAKEMAKE, run_snakemake

SMOKE = str(REPO / "config" / "presets" / "smoke.yaml")
# a hang guard, not a time limit: the smoke DAG takes 646-786 s on 2 cores here; an AVX2 CPU is up to 2x slower
HANG_GUARD_S = 2400


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    proc = run_snakemake(["all_tables", "--configfile", SMOKE, "--cores", "2"], workdir, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return workdir


def test_every_artifact_exists_and_is_non_empty(smoke_run):
    results = smoke_run / "results"
    expected = [
        "data/code/train.jsonl",
        "data/code/eval.jsonl",
        "data/math/train.jsonl",
        "data/math/eval.jsonl",
        "data/preferences/code/train.jsonl",
        "data/preferences/math/eval.jsonl",
        "data/tokenizer/tokenizer.json",
        "data/corpus/subset.jsonl",
        "data/corpus/stream.jsonl",
        "data/corpus/manifest.json",
        "models/tiny/teacher/config.json",
        "models/tiny/teacher/model.safetensors",
        "models/tiny/teacher/ar2dlm.json",
        "logs/teacher/tiny_loss.csv",
        "eval/teacher_check/tiny.json",
        "models/tiny/combined/seed0/train.json",
        "models/tiny/ed/seed0/step_4/model.safetensors",
        "models/tiny/ed/seed0/step_4/ar2dlm.json",
        "models/tiny/ed/seed0/log.jsonl",
        "summary.md",
        "summary.json",
        "eval/summary.csv",
        "eval/summary.md",
    ]
    for rel in expected:
        assert (results / rel).is_file() and (results / rel).stat().st_size > 0, rel


def test_summary_reports_measured_teacher_numbers(smoke_run):
    summary = json.loads((smoke_run / "results" / "summary.json").read_text())
    assert summary["preset"] == "smoke"
    (teacher,) = summary["teachers"]
    assert 0.0 <= teacher["pass@1 (base)"] <= 1.0 and teacher["held-out loss (code)"] > 0
    ev = json.loads((smoke_run / "results" / "eval" / "teacher_check" / "tiny.json").read_text())
    assert ev["n_tasks"] == 16 and len(ev["samples"]) == 16 and "transformers" in ev["versions"]
    provenance = json.loads((smoke_run / "results" / "models" / "tiny" / "teacher" / "ar2dlm.json").read_text())
    assert provenance["seed"] == 0 and provenance["data"]["steps"] == 20 and provenance["attention"] == "causal"


def test_every_study_evaluation_is_written(smoke_run):
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    conversions, teachers = resolve(merge_preset(yaml.safe_load(open(SMOKE)), REPO / "config")).evals
    ev = smoke_run / "results" / "eval"
    paths = [ev / b / m / r / f"seed{s}" / f"step_{k}.json" for b, m, r, s, k in conversions]
    paths += [ev / b / m / "teacher.json" for b, m in teachers]
    assert len(paths) > 50
    kinds = {}
    for path in paths:
        result = json.loads(path.read_text())
        kinds.setdefault(result["kind"], []).append(result)
        assert result["settings"]["kind"] == result["kind"] and "torch" in result["versions"]
        if result["kind"] in ("code", "math"):
            assert path.with_suffix(".samples.jsonl").stat().st_size > 0
    assert set(kinds) == {"code", "math", "harness", "embeddings", "throughput", "likelihood"}
    for r in kinds["code"]:
        assert r["samples_per_task"] == r["settings"]["n_samples"]
        assert ("base_pass@10" in r["metrics"]) == (r["samples_per_task"] >= 10)
    for r in kinds["throughput"]:  # AR: one row; block attention: its own block; bidirectional: the grid
        blocks = {row["block_size"] for row in r["rows"]}
        assert blocks == (
            {None}
            if r["conventions"]["attention"] == "causal"
            else {r["conventions"]["block_size"]}
            if r["conventions"]["attention"] == "block"
            else {8}
        )
    for r in kinds["embeddings"]:
        assert r["pooling"].endswith("causal" if r["method"] == "ar_pretrain" else "bidirectional")
    assert all(0 <= r["metrics"]["acc"] <= 1 for r in kinds["harness"])
    assert all(r["metrics"]["nll_per_token_code"] > 0 for r in kinds["likelihood"])


def test_armap_outputs(smoke_run):
    results = smoke_run / "results"
    for domain in ("code", "math"):
        base = results / "armap" / "tiny" / "mdlm" / "seed0" / domain
        assert (base / "shadowing.pdf").stat().st_size > 0 and (base / "shadowing.png").stat().st_size > 0
        for merge in ("task_arithmetic", "ties", "dare"):
            curve = json.loads((base / merge / "gamma.json").read_text())
            assert [r["gamma"] for r in curve["curve"]] == [0, 1, 2]
            assert curve["curve"][0]["reward_accuracy"] == 0.5  # the DLM itself: every margin a tie, counting half
    for domain in ("code", "math", "all"):
        dpo = json.loads((results / "models/tiny/teacher_dpo" / domain / "seed0/ar2dlm.json").read_text())
        assert dpo["method"] == "ar_dpo" and 0 <= dpo["reward_accuracy"] <= 1
    merged = json.loads((results / "models/tiny/mdlm/seed0/armap/code_task_arithmetic/ar2dlm.json").read_text())
    assert merged["attention"] == "bidirectional" and merged["gamma"] in (0, 1, 2)
    for objective in ("dpo", "plain_dpo", "simpo"):  # AR-MAP's baselines trained on the DLM, evaluated like it
        direct = json.loads((results / f"models/tiny/mdlm/seed0/dlm_{objective}/code/ar2dlm.json").read_text())
        assert direct["method"] == f"dlm_{objective}" and direct["dpo"]["objective"] == objective
        assert (results / f"eval/synthetic_code/tiny/mdlm/seed0/dlm_{objective}_code.json").is_file()
    assert (results / "eval/arithmetic/tiny/teacher/seed0/teacher_dpo_all.json").is_file()


def test_tables_figures_and_claims(smoke_run):
    from ar2dlm.pipeline.config import merge_preset

    config = merge_preset(yaml.safe_load(open(SMOKE)), REPO / "config")
    results = smoke_run / "results"
    paths = [results / "tables" / f"{s}.{ext}" for s in config["studies"] for ext in ("md", "csv", "tex")]
    for study, spec in config["studies"].items():
        if "figure" in spec:
            stem = study if study.startswith("ablations/") else f"figures/{study}"
            paths += [results / f"{stem}.{ext}" for ext in ("pdf", "png")]
    paths += [results / "tables" / "armap" / f"{t}.{ext}" for t in ("main", "merges") for ext in ("md", "csv", "tex")]
    paths += [results / "figures" / "armap" / f"{f}.{ext}" for f in ("gamma", "shadowing") for ext in ("pdf", "png")]
    paths += [results / "claims.md", results / "claims.csv", results / "ablations" / "lambda.pdf"]
    for p in paths:
        assert p.is_file() and p.stat().st_size > 0, p
    table = (results / "tables" / "repr_align" / "code.md").read_text()
    assert (
        "preset `smoke`" in table and "Reported in the papers" in table and "not at the smoke preset's scale" in table
    )
    # training columns: tokens, counted FLOPs and tokens/s from each run's manifest
    import pandas as pd

    freezing = pd.read_csv(results / "tables" / "repr_align" / "freezing.csv").set_index("run")
    for run in ("ra", "ra_freeze"):
        manifest = json.loads((results / "models" / "tiny" / run / "seed0" / "train.json").read_text())
        assert freezing.loc[run, "training tokens mean"] == manifest["tokens"]
        assert freezing.loc[run, "training tokens/s mean"] == pytest.approx(
            manifest["tokens"] / manifest["train_seconds"], abs=0.5
        )
        assert freezing.loc[run, "training FLOPs mean"] == pytest.approx(manifest["flops"]["total"], rel=1e-2)
        assert manifest["flops"]["teacher"] > 0  # alignment reads the teacher's hidden states
    # freezing embeddings and MLPs saves their weight gradients: fewer FLOPs per token
    ratio = {
        r: json.loads((results / "models" / "tiny" / r / "seed0" / "train.json").read_text())
        for r in ("ra", "ra_freeze")
    }
    assert (
        ratio["ra_freeze"]["flops"]["student"] / ratio["ra_freeze"]["tokens"]
        < ratio["ra"]["flops"]["student"] / ratio["ra"]["tokens"]
    )
    assert "training FLOPs mean" in pd.read_csv(results / "tables" / "efficient_dlm" / "attention.csv").columns
    assert pd.isna(freezing.loc["teacher", "training tokens mean"])
    claims = pd.read_csv(results / "claims.csv")
    # one seed per study in the smoke preset; where the smoke teacher cannot do the benchmark, that is said first
    teacher = {
        b: json.loads((results / "eval" / b / "tiny" / "teacher.json").read_text())["metrics"]
        for b in ("synthetic_code", "synthetic_code_sampled")
    }
    low = teacher["synthetic_code"]["base_pass@1"] < 0.3
    for _, row in claims.iterrows():
        scores = not row["measure"].startswith("training ")  # training tokens/s: no teacher floor
        if row["study"] in ("repr_align/metric", "repr_align/freezing", "combined") and low and scores:
            assert row["verdict"].startswith("uninformative (the AR teacher itself scores"), row.to_dict()
        elif row["id"] in ("armap_beats_direct_dpo", "armap_beats_simpo") and low:  # none of its benchmarks
            assert row["seeds"] == 0 and row["verdict"].startswith("uninformative (nothing to compare"), row.to_dict()
        elif row["study"] == "armap":  # two DLMs (mdlm, combined) and two domains of seed 0: one replicate
            assert row["seeds"] == 1 and row["verdict"].startswith("inconclusive (fewer than 3 seeds;"), row.to_dict()
        else:
            # one seed: no verdict, but whether it reproduces the paper's effect (the paper preset's reading)
            assert row["verdict"].startswith(("inconclusive (fewer than 3 seeds; the one seed", "uninformative")), (
                row.to_dict()
            )
    assert len(claims) == 24 and pd.notna(claims.loc[claims["study"] == "combined", "effect"]).all()
    assert (results / "claims_by_step.pdf").stat().st_size > 0
    shift = claims.set_index("id").loc["no_shift_beats_shift", "effect by training step"]
    assert [int(part.split(":")[0]) for part in shift.split(", ")] == [2, 4]  # every checkpoint of ed and ed_shift
    # provenance: every evaluation records the commit and the settings hashes; tables carry them
    from ar2dlm.pipeline import layout
    from ar2dlm.provenance import code_commit

    steps = json.loads((results / "models" / "tiny" / "ra" / "seed0" / "train.json").read_text())["steps"]
    evaluation = json.loads((smoke_run / layout.eval_path("synthetic_code", "tiny", "ra", 0, steps)).read_text())
    assert evaluation["provenance"]["commit"] == code_commit() != "unknown"
    # a table's score cell is the mean over the study's seeds (one here) of the evaluations it reads
    cell = freezing.loc["ra", "synthetic_code: base_pass@1 mean"]
    assert cell == pytest.approx(evaluation["metrics"]["base_pass@1"], abs=5e-4)
    assert str(freezing.loc["ra", "seeds"]) == "0" and freezing.loc["ra", "n seeds"] == 1
    assert freezing.loc["ra", "run settings sha256"] == evaluation["provenance"]["model_settings_sha256"]
    assert set(freezing["commit"]) == {code_commit()}
    freezing_md = (results / "tables" / "repr_align" / "freezing.md").read_text()
    # where the numbers were computed, and in which dtype (the smoke preset: fp32 throughout, on any CPU)
    from ar2dlm.provenance import machine

    here = machine()
    assert (
        f"Table made at commit {code_commit()}; its evaluations at {code_commit()}; computed on {here['cpu']} "
        f"({here['kernels']} kernels): evaluation fp32, training fp32; settings sha256"
    ) in freezing_md
    assert evaluation["versions"]["machine"]["dtype"] == "fp32"


def test_figures_say_their_seeds_and_draw_the_teacher(smoke_run, monkeypatch):
    """Each study figure's title gives the seeds its points average, and the AR teacher is drawn at its own
    score wherever it has the plotted measure (a dashed line, or a star on a speed axis)."""
    from ar2dlm.pipeline import layout
    from ar2dlm.pipeline.checks import checked_config
    from ar2dlm.reporting import figures

    resolved = checked_config(yaml.safe_load(open(SMOKE)), REPO / "config")
    config = resolved.config
    monkeypatch.chdir(smoke_run)
    drawn = {}
    monkeypatch.setattr(figures, "save", lambda fig, pdf, png: drawn.update(fig=fig))
    kinds = set()
    for study, spec in config["studies"].items():
        if "figure" not in spec:
            continue
        figures.study_figure(resolved, study, None, None)
        ax = drawn["fig"].axes[0]
        assert ax.get_title().endswith(("one seed, no spread", " seeds")), (study, ax.get_title())
        labels = ax.get_legend_handles_labels()[1]
        kinds.add(spec["figure"])
        if spec["figure"] in ("lambda", "steps", "flops"):  # the study's score: the teacher's own as a line
            first = spec["evals"][0]
            teacher = json.loads((smoke_run / layout.eval_path(first, "tiny", "teacher")).read_text())["metrics"]
            lines = [line for line in ax.get_lines() if line.get_label() == "AR teacher"]
            headline = resolved.benchmarks[first].headline_metric
            metric = ax.get_ylabel().split(": ")[1] if spec["figure"] != "flops" else headline
            assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(teacher[metric]), (study, labels)
        elif spec["figure"] == "retention":  # the share kept (the line at 1), unless the teacher scores 0
            said = [t.get_text() for t in ax.texts]
            assert "AR teacher" in labels or any("AR teacher scores 0" in t for t in said), (study, labels, said)
        elif spec["figure"] != "budget":  # speeds: a star
            assert "AR teacher" in labels, (study, labels)
    assert {"lambda", "flops"} <= kinds, kinds


def test_the_evaluation_pages_commands_run_as_written_on_the_smoke_block_model(smoke_run, tmp_path):
    """docs/evaluation.md's "outside the pipeline" blocks (load and decode, lm-eval's command line, the
    evalplus rescoring), run as written where the paths they name are the smoke run's; the rescored pass@1
    equals the engine's on the same tasks."""
    import subprocess
    import sys

    from ar2dlm.core.engine import generate
    from ar2dlm.core.models import load_model
    from ar2dlm.core.sampling import Decoding
    from ar2dlm.evaluation.code import code_prompts, postprocess, read_problems, score_responses
    from tests.conftest import snakemake_env

    page = (REPO / "docs" / "evaluation.md").read_text()
    section = page[page.index("### A converted checkpoint outside the pipeline") : page.index("### Helpfulness")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["python", "bash", "bash"]
    work = tmp_path / "work"
    checkpoint = re.search(r"results/models/tiny/ed/seed0/step_\d+", section).group(0)
    problems = re.search(r"results/data/benchmarks/\w+\.jsonl", section).group(0)
    steps = json.loads((smoke_run / "results/models/tiny/ed/seed0/train.json").read_text())["steps"]
    for name, target in ((checkpoint, f"results/models/tiny/ed/seed0/step_{steps}"), (problems, problems)):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).symlink_to(smoke_run / target)
    env = snakemake_env(PYTHONPATH=str(REPO))
    for lang, code in blocks:
        cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, (code, proc.stderr[-3000:])
    # the same responses as the engine's on the same tasks, and the same scores
    rescored = json.loads((work / "rescored.json").read_text())
    tasks = read_problems(work / problems)[: int(re.search(r"--limit (\d+)", section).group(1))]
    model, tok, conv, _ = load_model(str(work / checkpoint))
    out, _ = generate(model, conv, code_prompts(tok, tasks), Decoding(64, threshold=0.9))
    cfg = {"format": "evalplus", "dataset": "humaneval", "style": "body", "parallel": 2}
    engine = score_responses(tok, tasks, out, cfg)
    logged = {
        (r := json.loads(line))["doc"]["task_id"]: r["resps"][0][0]
        for line in next((work / "lm_eval_out").rglob("samples_code_completion_*.jsonl")).read_text().splitlines()
    }
    by_id = {t["task_id"]: t for t in tasks}
    assert {tid: postprocess(by_id[tid], text, "body")["completion"] for tid, text in logged.items()} == {
        s["task_id"]: s["completion"] for s in engine["samples"]
    }
    assert rescored["n_samples"] == len(tasks) and rescored["metrics"] == engine["metrics"]


def test_html_report(smoke_run, tmp_path):
    """``snakemake --report`` (all_tables, the default target): every study table (Markdown and CSV), figure,
    AR-MAP's tables and figures and the claims, each with its caption; before any run, one line instead."""
    proc = run_snakemake(["--report", "report.html", "--configfile", SMOKE], smoke_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (smoke_run / "report.html").read_text()  # items and captions are in the page's data
    from ar2dlm.pipeline.config import merge_preset

    config = merge_preset(yaml.safe_load(open(SMOKE)), REPO / "config")
    for study, spec in config["studies"].items():
        assert f"{study}.md" in page and f"{study}.csv" in page, study
        if "figure" in spec:
            assert f"{study.split('/')[-1]}.png" in page, study
    for item in ("armap/main.csv", "gamma.png", "shadowing.png", "claims.md", "claims.csv", "eval/summary.csv"):
        assert item in page, item
    assert "share of the teacher" in page and "one seed, no spread" in page  # a study table's caption
    assert "does not hold" in page and "spectral norms" in page  # the claims' and AR-MAP's captions
    # before any run: one line saying a report needs one, no empty report
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_snakemake(["--report", "report.html", "--configfile", SMOKE], empty)
    assert proc.returncode != 0 and "holds none yet" in proc.stdout + proc.stderr
    assert not (empty / "report.html").exists()


def test_second_run_has_nothing_to_do(smoke_run, tmp_path):
    proc = run_snakemake(["-n", "all_tables", "--configfile", SMOKE], smoke_run)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr
    # switching on a tracker reruns nothing
    tracking = tmp_path / "tracking.yaml"
    tracking.write_text(yaml.safe_dump({"tracking": {"backend": "tensorboard", "project": "ar2dlm"}}))
    proc = run_snakemake(["-n", "all_tables", "--configfile", SMOKE, str(tracking)], smoke_run)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def test_decode_benchmark_rule(smoke_run):
    proc = run_snakemake(["bench", "--configfile", SMOKE, "--cores", "2"], smoke_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = json.loads((smoke_run / "results" / "bench" / "decode.json").read_text())
    rows = {(r["decoder"], r["threshold"]): r for r in bench["rows"]}
    assert set(rows) == {("hf_generate", None), ("engine_ar", None)} | {
        (d, t) for d in ("dynamic_dlm", "engine_dlm") for t in (0.5, 1.0)
    }
    # the engine decodes what the paths it replaced decode, and every row's responses are scored
    assert rows["engine_ar", None]["same_as_replaced"] == rows["engine_dlm", 0.5]["same_as_replaced"] == 1.0
    assert rows["engine_ar", None]["pass@1"] == rows["hf_generate", None]["pass@1"]
    assert all(0 <= r["pass@1"] <= 1 and r["response_tokens"] > 0 for r in rows.values())
    assert rows["engine_dlm", 1.0]["tokens_per_forward"] < 1  # one token a step, plus the prefill and block joins
    assert rows["engine_dlm", 0.5]["tokens_per_forward"] >= rows["engine_dlm", 1.0]["tokens_per_forward"]
    assert set(bench["ms_per_forward"]["engine_dlm@0.5"]) <= {"prefill", "block", "block_first"}
    assert bench["equal_accuracy"]["reference_threshold"] == 1.0 and bench["prompts"] == 3
    assert set(bench["cost_curve"]["model"]["ms_per_forward"]) == {"1", "8"}
    assert bench["model"].endswith("ed_long/seed0/step_8") and bench["ar_model"].endswith("models/tiny/teacher")
    assert (smoke_run / "results" / "bench" / "decode.md").read_text().startswith("| decoder")
    train = json.loads((smoke_run / "results" / "bench" / "train.json").read_text())
    assert set(train["runs"]) == {"mdlm", "ra", "ra_freeze"} and train["freeze_speedup"] > 0
    models = smoke_run / "results" / "models"
    runs = {str(m.parent.relative_to(models)) for m in models.glob("*/*/seed*/train.json")}
    assert len(runs) > 20 and set(train["wall_seconds"]) == runs and "no CUDA" in train["gpu"]


# CPUs the local node advertises on this machine's 2 cores: one-CPU jobs run two to a core, so that one's
# SLURM and Snakemake latency is filled by another's work.
NODE_CPUS = 4
# What the cluster builds: AR-MAP's main table, the DAG's longest chain (data, teacher, conversions, teacher and
# DLM DPO, spectra, gamma searches, merges and their evaluations), and OPDLM's main table (on-policy rollouts,
# harness evaluations). The other studies, figures, summaries and claims repeat these job kinds on the local
# run above.
SLURM_TARGETS = ["results/tables/armap/main.csv", "results/tables/opdlm/main.csv"]


SLURM_SKIPPED = "the SLURM cluster test did not run, so the cluster path is untested"


def _slurm_profile(path, jobs_dir):
    """The repo's SLURM profile mapped onto the local CPU partition: no GPUs, small memory, the status read
    from squeue (no accounting), the short data and evaluation jobs packed into small group jobs."""
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    cpu = {"slurm_partition": "cpu", "mem_mb": 2000, "runtime": "30m"}
    profile["default-resources"] = dict(cpu)
    profile["set-resources"] = {rule: dict(cpu, cpus_per_task=1) for rule in profile["set-resources"]}
    # Every ready job is submitted (the profile's job limit) and SLURM's queue keeps the node busy: a job starts
    # as soon as another ends, not at Snakemake's next status check (which backs off by 10 s per check while
    # no job ends). A group job runs its members one at a time (--jobs 1 inside the job, plugin issue #469),
    # so only short independent jobs are grouped, into group jobs of equal size: the data chain and the
    # teacher (one job), and evaluations, four to a job. A conversion is not grouped with its evaluations:
    # with AR-MAP's chain on it they would form one connected component, run serially in one job.
    groups = {rule: "prep" for rule in ("synthetic_suites", "tokenizer", "corpus", "teacher")}
    groups |= {
        rule: "eval"
        for rule in (
            "evaluate_checkpoint",
            "evaluate_teacher",
            "evaluate_armap_model",
            "evaluate_dlm_preference",
            "evaluate_teacher_dpo",
        )
    }
    profile.update(
        {
            "cores": 1,
            "local-cores": 2,
            "latency-wait": 5,
            "retries": 0,
            "slurm-status-command": "squeue",
            "slurm-no-account": True,
            "slurm-init-seconds-before-status-checks": 1,
            "slurm-logdir": str(jobs_dir),
            "groups": [f"{k}={v}" for k, v in groups.items()],
            "group-components": ["eval=4"],
        }
    )
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(profile))
    return path


def _same_tables(got, want, targets):
    """Every table the cluster built (the targets and what their rules write beside them) equal to the local
    run's, less the measured speeds (tokens/s), which depend on the machine's load."""
    import pandas as pd

    names = sorted(p.relative_to(got) for p in (got / "results" / "tables").rglob("*.csv"))
    assert {Path(t) for t in targets} <= set(names), names
    for name in names:
        a, b = pd.read_csv(got / name), pd.read_csv(want / name)
        speeds = [c for c in b.columns if "tokens/s" in c]
        pd.testing.assert_frame_equal(a.drop(columns=speeds), b.drop(columns=speeds), obj=str(name))


def _submitted_jobs(log: Path) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", log.read_text()) if log.exists() else []


@pytest.mark.slurm
def test_slurm_cluster_runs_the_dag_and_a_cancelled_run_resumes(smoke_run, tmp_path):
    import os
    import shutil
    import subprocess
    import time

    from tests.local_slurm import LocalSlurm, install

    why = install()
    if why:  # said again at the end of the run (tests/conftest.py); AR2DLM_REQUIRE_SLURM=1 (CI) fails instead
        if os.environ.get("AR2DLM_REQUIRE_SLURM") == "1":
            pytest.fail(f"AR2DLM_REQUIRE_SLURM=1 and no local SLURM: {why}")
        pytest.skip(f"{SLURM_SKIPPED}: {why}")
    cluster = LocalSlurm(tmp_path / "cluster", cpus=NODE_CPUS).start()
    tables = run = None
    try:
        profile = _slurm_profile(tmp_path / "profile", tmp_path / "slurm_logs")
        env = dict(cluster.env, HF_HUB_OFFLINE="1")
        work, resume = tmp_path / "work", tmp_path / "resume"
        work.mkdir()
        snakemake = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--profile", str(profile)]
        t0 = time.time()
        tables_log = tmp_path / "all_tables.log"
        with tables_log.open("w") as out:  # AR-MAP's chain is the DAG's longest: its jobs go first
            tables = subprocess.Popen(
                [*snakemake, *SLURM_TARGETS, "--configfile", SMOKE, "--prioritize", SLURM_TARGETS[0]],
                cwd=work,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        # Meanwhile, on the same cluster and in its own folder: a longer conversion, cancelled through SLURM
        # after its first checkpoint, resumes from it on the rerun. It starts from the local run's data and
        # teacher (copied with their times, so nothing upstream reruns).
        for rel in ("data", "models/tiny/teacher"):
            shutil.copytree(smoke_run / "results" / rel, resume / "results" / rel)
        override = tmp_path / "long.yaml"  # 500 steps (15 s or more) left to cancel it in after its first checkpoint
        override.write_text(yaml.safe_dump({"runs": {"mdlm": {"training": {"steps": 600, "checkpoint_every": 100}}}}))
        target = "results/models/tiny/mdlm/seed0/train.json"
        # its own SLURM log folder: the plugin removes empty folders there when it starts, and a queued job's
        # folder is empty until the job starts
        # and it goes through the multi-node launch path (srun starts a torchrun per node, c10d rendezvous) with
        # two processes on the one node, as a planned paper job does with its GPUs
        cmd = [
            *snakemake,
            target,
            "--configfile",
            SMOKE,
            str(override),
            "--slurm-logdir",
            str(tmp_path / "slurm_logs_resume"),
            "--set-resources",
            "convert:mpi=srun",
            "convert:tasks=2",
            "convert:nodes=1",
            "convert:tasks_per_gpu=0",
        ]
        first_log = tmp_path / "resume_first.log"
        with first_log.open("w") as out:
            run = subprocess.Popen(cmd, cwd=resume, env=env, stdout=out, stderr=subprocess.STDOUT)
        ckpt_dir = resume / "results/models/tiny/mdlm/seed0"
        deadline = time.time() + 900
        while not ((ckpt_dir / "step_100" / "trainer_state.pt").exists() and _submitted_jobs(first_log)):
            assert time.time() < deadline and run.poll() is None, first_log.read_text()[-3000:]
            time.sleep(0.5)
        (job,) = _submitted_jobs(first_log)  # only this run's job: all_tables' jobs run on
        subprocess.run(["scancel", job], env=env, check=True)
        run.wait(timeout=120)
        assert run.returncode != 0 and not (ckpt_dir / "train.json").exists()
        assert re.search(r"^total\s+1$", first_log.read_text(), re.M)  # the conversion alone: nothing upstream reran
        proc = subprocess.run(cmd, cwd=resume, env=env, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-4000:]
        manifest = json.loads((ckpt_dir / "train.json").read_text())
        assert manifest["resumed_from"] >= 100 and manifest["steps"] == 600
        assert "--rdzv_backend=c10d" in proc.stdout + proc.stderr  # two processes through srun + torchrun
        assert (resume / "results/logs/convert/tiny_mdlm_seed0.log.rank1").is_file()

        tables.wait(timeout=HANG_GUARD_S - (time.time() - t0))
        assert tables.returncode == 0, tables_log.read_text()[-4000:]
        assert _submitted_jobs(tables_log)
        print(f"{' '.join(SLURM_TARGETS)} through SLURM, with the resume check beside it: {time.time() - t0:.0f} s")
        # the cluster produced what a local run produces: the same data, and the same trained weights up to
        # float reordering (a job's thread count may differ from the local run's)
        from safetensors.torch import load_file

        for rel in ("data/code/eval.jsonl", "data/corpus/subset.jsonl", "data/math/eval.jsonl"):
            assert (work / "results" / rel).read_bytes() == (smoke_run / "results" / rel).read_bytes(), rel
        for rel in ("teacher", "mdlm/seed0/step_4", "opd_noshift/seed0/step_4"):
            a = load_file(work / "results/models/tiny" / rel / "model.safetensors")
            b = load_file(smoke_run / "results/models/tiny" / rel / "model.safetensors")
            assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a), rel
        _same_tables(work, smoke_run, SLURM_TARGETS)
    finally:
        for child in (tables, run):
            if child is not None and child.poll() is None:
                child.kill()
        cluster.stop()
    assert not any(p.poll() is None for p in cluster.procs)
    assert os.path.isdir(tmp_path / "cluster")
