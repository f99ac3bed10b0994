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

    tiny["claims"]["judged"] = {"pass10": _claim(benchmark="synthetic_code_sampled", metric="base_pass@10")}
    check_claims(tiny)
    _write_results(tiny, _scores)
    row = evaluate_claims(tiny)[0].iloc[0]
    assert row["measure"] == "synthetic_code_sampled base_pass@10: ra minus mdlm" and row["effect"] == pytest.approx(
        -0.6
    )
    # pass@1 from the same samples beside it: its own effect and each arm's mean
    assert row["pass@1 beside"] == "base_pass@1 +0.2000 (ra 0.710, mdlm 0.510)"
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


def _armap_claim(measure: str, **keys) -> dict:
    return {
        "paper": "AR-MAP",
        "text": "t",
        "quote": "q",
        "direction": "greater",
        "armap": {"measure": measure, "merge": "task_arithmetic", **keys},
    }


def test_armap_claims_compare_the_merge_with_direct_dpo_and_order_the_domains_gammas(tiny):
    """merged_vs_direct pairs each DLM's merged and directly DPO'd evaluations per domain benchmark;
    gamma_order differences the two domains' gamma_hat per DLM; bad domains or an unevaluated merge are
    named by key."""
    from ar2dlm.pipeline import layout
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    tiny["claims"]["judged"] = {
        "direct": _armap_claim("merged_vs_direct"),
        "order": _armap_claim("gamma_order", lower="math", higher="code"),
    }
    check_claims(tiny)
    inputs = claim_inputs(tiny)
    dlms = [(m, r, s) for m, r, s in [("tiny", "mdlm", s) for s in tiny["armap"]["seeds"]]]
    merged = [
        layout.derived_eval_path(b, *d, layout.armap_name(pd, "task_arithmetic"))
        for d in dlms
        for pd, b in (("code", "synthetic_code"), ("math", "arithmetic"))
    ]
    assert set(merged) <= set(inputs)
    for path in map(Path, inputs):
        path.parent.mkdir(parents=True, exist_ok=True)
        seed = int(path.parts[-2 if path.name != "gamma.json" else -4].removeprefix("seed"))
        if path.name == "gamma.json":  # code's gamma_hat above math's by 2 + seed
            gamma = 3.0 + seed if path.parts[-3] == "code" else 1.0
            path.write_text(json.dumps({"gamma_hat": gamma, "curve": []}))
        else:  # the merge beats direct DPO by 0.1 + 0.05 * seed on each domain's headline metric
            score = 0.5 + (0.1 + 0.05 * seed if path.name.startswith("armap_") else 0.0)
            path.write_text(json.dumps({"metrics": {m: score for m in METRICS}}))
    df = evaluate_claims(tiny)[0].set_index("id")
    assert df.loc["direct", "seeds"] == 6 and df.loc["direct", "effect"] == pytest.approx(0.15)
    assert df.loc["direct", "verdict"] == "holds"
    assert df.loc["direct", "measure"].endswith("(code: synthetic_code, math: arithmetic)")
    assert df.loc["order", "seeds"] == 3 and df.loc["order", "effect"] == pytest.approx(3.0)
    assert df.loc["order", "measure"] == "gamma_hat of code minus gamma_hat of math (task_arithmetic)"
    assert df.loc["order", "verdict"] == "holds"

    tiny["claims"]["judged"]["order"]["armap"]["lower"] = "helpful"
    with pytest.raises(ConfigError, match=r"claims\.judged\.order\.armap\.lower.*'helpful' is not one of armap"):
        check_claims(tiny)
    tiny["claims"]["judged"]["order"]["armap"]["lower"] = "math"
    tiny["armap"]["merges"]["ties"] = {"density": 0.2}
    tiny["claims"]["judged"]["direct"]["armap"]["merge"] = "ties"
    with pytest.raises(ConfigError, match=r"claims\.judged\.direct\.armap\.merge.*'ties' is not evaluated"):
        check_claims(tiny)


def test_claims_markdown_quotes_the_sentence_each_claim_tests(tiny):
    from ar2dlm.reporting.claims import claims_markdown, evaluate_claims

    tiny["claims"]["judged"] = {"base": _claim(quote="la frase"), "ours": _claim(paper="combined")}
    _write_results(tiny, _scores)
    md = claims_markdown(evaluate_claims(tiny)[0], "tiny")
    assert "- **base** (REPR-ALIGN): “la frase”" in md and "- **ours** (combined): beyond the papers" in md
