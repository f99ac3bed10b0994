"""The claims report judges what the config declares (claims.judged): the runs, benchmark, metric,
direction and margin each claim names, in the declared order."""

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

METRICS = ("base_pass@1", "plus_pass@1", "base_pass@10", "plus_pass@10", "exact_match", "acc", "main_score")


def _write_results(config: dict, score) -> None:
    """Every file the claims read, in the working directory, each evaluation scoring
    ``score(benchmark, run, seed, metric)``."""
    from ar2dlm.reporting.claims import claim_inputs

    for path in map(Path, claim_inputs(config)):
        path.parent.mkdir(parents=True, exist_ok=True)
        bench, run = path.parts[2], "teacher" if path.name == "teacher.json" else path.parts[4]
        seed = None if run == "teacher" else int(path.parts[5].removeprefix("seed"))
        path.write_text(json.dumps({"metrics": {m: score(bench, run, seed, m) for m in METRICS}}))


def _claim(**keys) -> dict:
    return {
        "paper": "REPR-ALIGN",
        "text": "alignment helps",
        "study": "repr_align/code",
        "run": "ra",
        "against": "mdlm",
        "benchmark": "synthetic_code",
        "metric": "base_pass@1",
        "direction": "greater",
        **keys,
    }


def _scores(bench, run, seed, metric):
    """ra beats mdlm on base pass@1 by 0.2 and loses to it by 0.2 on plus pass@1; the teacher scores 0.8."""
    if run == "teacher":
        return 0.8
    own = {
        ("ra", "base_pass@1"): 0.7,
        ("mdlm", "base_pass@1"): 0.5,
        ("ra", "plus_pass@1"): 0.4,
        ("mdlm", "plus_pass@1"): 0.6,
        ("ra", "base_pass@10"): 0.3,
        ("mdlm", "base_pass@10"): 0.9,
    }
    return own.get((run, metric), 0.5) + 0.01 * seed


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    from ar2dlm.pipeline.config import merge_preset

    monkeypatch.chdir(tmp_path)
    cfg = merge_preset({"preset": "tiny"}, REPO / "config")
    cfg["claims"]["min_effect"] = 0.0
    return cfg


def test_a_claim_reads_the_runs_metric_direction_and_margin_its_config_names(tiny):
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.reporting.claims import evaluate_claims

    tiny["claims"]["judged"] = {
        "base": _claim(),
        "plus": _claim(metric="plus_pass@1"),
        "plus_not_worse": _claim(metric="plus_pass@1", direction="not_worse"),
        "plus_within_margin": _claim(metric="plus_pass@1", direction="not_worse", margin=0.25),
        "vs_teacher": _claim(against="teacher"),
    }
    check_claims(tiny)
    _write_results(tiny, _scores)
    df = evaluate_claims(tiny)[0].set_index("id")
    assert list(df.index) == ["base", "plus", "plus_not_worse", "plus_within_margin", "vs_teacher"]
    assert df.loc["base", "measure"] == "synthetic_code base_pass@1: ra minus mdlm"
    assert df.loc["base", "verdict"] == "holds" and df.loc["base", "effect"] == pytest.approx(0.2)
    assert df.loc["plus", "verdict"] == "does not hold" and df.loc["plus", "effect"] == pytest.approx(-0.2)
    assert df.loc["plus_not_worse", "verdict"] == "does not hold" and df.loc["plus_not_worse", "test"] == "not_worse"
    assert df.loc["plus_within_margin", "verdict"] == "holds"  # -0.2 lies within the claim's own margin
    assert df.loc["vs_teacher", "measure"].endswith("ra minus teacher") and df.loc["vs_teacher", "effect"] < 0


def test_a_pass_at_10_claim_is_a_config_edit(tiny):
    """A claim on pass@10 names a sampled benchmark of its study and the metric; the judge reads it."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import evaluate_claims

    tiny["studies"]["repr_align/code"]["evals"].append("synthetic_code_sampled")
    tiny["claims"]["judged"] = {"pass10": _claim(benchmark="synthetic_code_sampled", metric="base_pass@10")}
    check_claims(tiny)
    _write_results(tiny, _scores)
    row = evaluate_claims(tiny)[0].iloc[0]
    assert row["measure"] == "synthetic_code_sampled base_pass@10: ra minus mdlm" and row["effect"] == pytest.approx(
        -0.6
    )
    tiny["claims"]["judged"]["pass10"]["benchmark"] = "synthetic_code"  # greedy: one sample per task
    with pytest.raises(ConfigError, match=r"claims\.judged\.pass10\.metric.*needs at least 10 samples"):
        check_claims(tiny)


@pytest.mark.parametrize("preset", ["smoke", "tiny", "tiny_full", "paper", "paper_standin"])
def test_every_preset_declares_the_claims_of_its_studies(preset):
    """Each preset declares claims, each on a study it runs (or AR-MAP's searches), valid under the
    schema and the checks."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import merge_preset, validate_config
    from ar2dlm.reporting.claims import declared_claims

    cfg = merge_preset({"preset": preset}, REPO / "config")
    validate_config(cfg, REPO / "config" / "schema.yaml")  # the schema with the registry's methods and terms
    check_claims(cfg)
    claims = declared_claims(cfg)
    assert claims and all(c.study in cfg["studies"] for c in claims if not c.armap)
    assert {c.paper for c in claims} >= {"REPR-ALIGN", "OPDLM", "Efficient-DLM", "AR-MAP"}
