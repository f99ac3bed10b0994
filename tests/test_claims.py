"""The claims report judges what the config declares (claims.judged): the runs, benchmark, metric,
direction and paper's effect each claim names, in the declared order; the verdict rule on per-seed
differences with known answers."""

import json
from pathlib import Path

import pytest

from ar2dlm.pipeline.resolved import resolve
from tests.conftest import REPO

METRICS = ("base_pass@1", "plus_pass@1", "base_pass@10", "plus_pass@10", "exact_match", "acc", "main_score")


def _write_results(config: dict, score) -> None:
    """Every file the claims read, in the working directory, each evaluation scoring
    ``score(benchmark, run, seed, metric)``."""
    from ar2dlm.reporting.claims import claim_inputs

    for path in map(Path, claim_inputs(resolve(config))):
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
        "effect": {"value": 0.05, "where": "test"},
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


# tiny_full's bidirectional ablation of the block recipe (tiny trains only the block recipe itself)
ED_BIDIR = {"method": "efficient_dlm", "block_size": 8, "attention": "bidirectional"}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    from ar2dlm.pipeline.config import merge_preset

    monkeypatch.chdir(tmp_path)
    return merge_preset({"preset": "tiny"}, REPO / "config")


def test_a_claim_reads_the_runs_metric_direction_and_effect_its_config_names(tiny):
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.reporting.claims import evaluate_claims

    tiny["claims"]["judged"] = {
        "base": _claim(),
        "plus": _claim(metric="plus_pass@1"),
        "plus_not_worse": _claim(metric="plus_pass@1", direction="not_worse"),
        "plus_within_tolerance": _claim(
            metric="plus_pass@1", direction="not_worse", effect={"value": 0.25, "where": "t"}
        ),
        "vs_teacher": _claim(against="teacher"),
    }
    check_claims(resolve(tiny))
    _write_results(tiny, _scores)
    df = evaluate_claims(resolve(tiny))[0].set_index("id")
    assert list(df.index) == ["base", "plus", "plus_not_worse", "plus_within_tolerance", "vs_teacher"]
    assert df.loc["base", "measure"] == "synthetic_code base_pass@1: ra minus mdlm"
    assert df.loc["base", "verdict"] == "holds" and df.loc["base", "effect"] == pytest.approx(0.2)
    assert df.loc["plus", "verdict"].startswith("does not hold (the paper's effect excluded, reversed")
    assert df.loc["plus", "effect"] == pytest.approx(-0.2) and df.loc["plus", "paper effect"] == 0.05
    assert df.loc["plus_not_worse", "verdict"].startswith("does not hold (a loss beyond the tolerated 0.05")
    assert df.loc["plus_within_tolerance", "verdict"] == "holds"  # -0.2 lies within the loss it tolerates
    assert df.loc["vs_teacher", "measure"].endswith("ra minus teacher") and df.loc["vs_teacher", "effect"] < 0


def test_a_pass_at_10_claim_is_a_config_edit(tiny):
    """A claim on pass@10 names a sampled benchmark of its study and the metric; the judge reads it."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import evaluate_claims

    tiny["claims"]["judged"] = {"pass10": _claim(benchmark="synthetic_code_sampled", metric="base_pass@10")}
    check_claims(resolve(tiny))
    _write_results(tiny, _scores)
    row = evaluate_claims(resolve(tiny))[0].iloc[0]
    assert row["measure"] == "synthetic_code_sampled base_pass@10: ra minus mdlm" and row["effect"] == pytest.approx(
        -0.6
    )
    # pass@1 from the same samples beside it: its own effect and each arm's mean
    assert row["pass@1 beside"] == "base_pass@1 +0.2000 (ra 0.710, mdlm 0.510)"
    tiny["claims"]["judged"]["pass10"]["benchmark"] = "synthetic_code"  # greedy: one sample per task
    with pytest.raises(ConfigError, match=r"claims\.judged\.pass10\.metric.*needs at least 10 samples"):
        check_claims(resolve(tiny))


@pytest.mark.parametrize("preset", ["smoke", "tiny", "tiny_full", "paper", "paper_standin"])
def test_every_preset_declares_the_claims_of_its_studies(preset):
    """Each preset declares claims, each on a study it runs (or AR-MAP's searches), valid under the
    schema and the checks."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.claims import declared_claims
    from ar2dlm.pipeline.config import merge_preset, validate_config

    cfg = merge_preset({"preset": preset}, REPO / "config")
    validate_config(cfg, REPO / "config" / "schema.yaml")  # the schema with the registry's methods and terms
    check_claims(resolve(cfg))
    claims = declared_claims(cfg)
    assert claims and all(c.study in cfg["studies"] for c in claims if not c.armap)
    assert {c.paper for c in claims} >= {"REPR-ALIGN", "OPDLM", "Efficient-DLM", "AR-MAP"}


def _armap_claim(measure: str, **keys) -> dict:
    return {
        "paper": "AR-MAP",
        "text": "t",
        "quote": "q",
        "direction": "greater",
        "effect": {"value": 0.05, "where": "test"},
        "armap": {"measure": measure, "merge": "task_arithmetic", **keys},
    }


def test_armap_claims_compare_the_merge_with_direct_dpo_and_order_the_domains_gammas(tiny):
    """merged_vs_direct pairs each DLM's merged and directly DPO'd evaluations per domain benchmark,
    leaving out the benchmarks the AR teacher scores below the floor on; gamma_order differences the
    two domains' gamma_hat per DLM; bad domains or an unevaluated merge are named by key."""
    from ar2dlm.pipeline import layout
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    tiny["claims"]["judged"] = {
        "direct": _armap_claim("merged_vs_direct"),
        "simpo": _armap_claim("merged_vs_direct", baseline="simpo"),
        "order": {**_armap_claim("gamma_order", lower="math", higher="code"), "effect": {"value": 1, "where": "t"}},
    }
    with pytest.raises(ConfigError, match=r"claims\.judged\.simpo\.armap\.baseline.*armap\.dlm_simpo, not configured"):
        check_claims(resolve(tiny))
    tiny["armap"]["dlm_simpo"] = {**tiny["armap"]["dlm_dpo"], "beta": 2.0, "gamma": 0.5}
    check_claims(resolve(tiny))
    inputs = claim_inputs(resolve(tiny))
    for o in ("dpo", "simpo"):  # each claim reads its own baseline's evaluations
        assert layout.derived_eval_path("synthetic_code", "tiny", "mdlm", 0, f"dlm_{o}_code") in inputs
    dlms = [(m, r, s) for m, r, s in [("tiny", "mdlm", s) for s in tiny["armap"]["seeds"]]]
    merged = [
        layout.derived_eval_path(b, *d, layout.armap_name(pd, "task_arithmetic"))
        for d in dlms
        for pd, b in (("code", "synthetic_code"), ("math", "arithmetic"))
    ]
    assert set(merged) <= set(inputs)
    for path in map(Path, inputs):
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "teacher.json":  # arithmetic below the teacher floor: its cells are left out
            score = 0.17 if path.parts[2] == "arithmetic" else 0.8
            path.write_text(json.dumps({"metrics": {m: score for m in METRICS}}))
            continue
        seed = int(path.parts[-2 if path.name != "gamma.json" else -4].removeprefix("seed"))
        if path.name == "gamma.json":  # code's gamma_hat above math's by 2 + seed
            gamma = 3.0 + seed if path.parts[-3] == "code" else 1.0
            path.write_text(json.dumps({"gamma_hat": gamma, "curve": []}))
        else:  # the merge beats direct DPO by 0.1 + 0.05 * seed on each domain's headline metric, SimPO by 0.1 more
            score = 0.5 + (0.1 + 0.05 * seed if path.name.startswith("armap_") else 0.0)
            score -= 0.1 if path.name.startswith("dlm_simpo_") else 0.0
            path.write_text(json.dumps({"metrics": {m: score for m in METRICS}}))
    df = evaluate_claims(resolve(tiny))[0].set_index("id")
    assert df.loc["direct", "seeds"] == 3 and df.loc["direct", "effect"] == pytest.approx(0.15)
    assert df.loc["direct", "verdict"].startswith("holds")
    assert df.loc["simpo", "seeds"] == 3 and df.loc["simpo", "effect"] == pytest.approx(0.25)
    assert "domain's benchmarks (DLM SimPO (direct); code: synthetic_code;" in df.loc["simpo", "measure"]
    assert "(DLM DPO (direct, VRPO's estimator); code:" in df.loc["direct", "measure"]
    assert df.loc["direct", "measure"].endswith(
        "code: synthetic_code; left out, the AR teacher below 0.3: arithmetic (0.170))"
    )
    assert df.loc["order", "seeds"] == 3 and df.loc["order", "effect"] == pytest.approx(3.0)
    assert df.loc["order", "measure"] == "gamma_hat of code minus gamma_hat of math (task_arithmetic)"
    assert df.loc["order", "verdict"] == "holds"

    tiny["claims"]["judged"]["order"]["armap"]["lower"] = "helpful"
    with pytest.raises(ConfigError, match=r"claims\.judged\.order\.armap\.lower.*'helpful' is not one of armap"):
        check_claims(resolve(tiny))
    tiny["claims"]["judged"]["order"]["armap"]["lower"] = "math"
    tiny["armap"]["merges"]["ties"] = {"density": 0.2}
    tiny["claims"]["judged"]["direct"]["armap"]["merge"] = "ties"
    with pytest.raises(ConfigError, match=r"claims\.judged\.direct\.armap\.merge.*'ties' is not evaluated"):
        check_claims(resolve(tiny))


def test_claims_markdown_quotes_the_sentence_each_claim_tests(tiny):
    from ar2dlm.reporting.claims import claims_markdown, evaluate_claims

    tiny["claims"]["judged"] = {"base": _claim(quote="la frase"), "ours": _claim(paper="combined")}
    _write_results(tiny, _scores)
    md = claims_markdown(evaluate_claims(resolve(tiny))[0], "tiny")
    assert "- **base** (REPR-ALIGN): “la frase”" in md and "- **ours** (combined): beyond the papers" in md


def _spread(mean: float, sd: float, n: int) -> list[float]:
    """n per-seed differences with exactly this mean and sample standard deviation."""
    import numpy as np

    z = np.linspace(-1.0, 1.0, n)
    return list(mean + sd * (z - z.mean()) / z.std(ddof=1))


def _interval(diffs: list[float]) -> tuple[float, float]:
    """The 95% t interval of the mean, by hand."""
    import numpy as np
    from scipy import stats

    n, m, sd = len(diffs), float(np.mean(diffs)), float(np.std(diffs, ddof=1))
    half = stats.t.ppf(0.975, n - 1) * sd / n**0.5
    return m - half, m + half


@pytest.mark.parametrize(
    "mean, sd, n, test, effect, verdict",
    [
        (0.10, 0.02, 5, "greater", 0.061, "holds"),  # interval [0.075, 0.125] above 0 and reaching E
        (0.03, 0.006, 5, "greater", 0.061, "holds (an effect smaller than the paper's"),  # [0.023, 0.037]
        (0.0, 0.015, 5, "greater", 0.061, "does not hold (the paper's effect excluded, the interval lies below"),
        (-0.1, 0.02, 3, "greater", 0.061, "does not hold (the paper's effect excluded, reversed"),
        (0.05, 0.1, 4, "greater", 0.061, "inconclusive"),  # [-0.11, 0.21]: contains 0 and E
        (0.03, 0.1, 6, "greater", 0.0171, "inconclusive"),
        (-0.005, 0.01, 4, "not_worse", 0.03, "holds"),  # [-0.021, 0.011] above -0.03
        (-0.1, 0.015, 4, "not_worse", 0.03, "does not hold (a loss beyond the tolerated 0.03"),
        (-0.03, 0.06, 3, "near_best", 0.03, "inconclusive"),
        (0.2, 0.05, 2, "greater", 0.061, "inconclusive (fewer than 3 seeds; the 2 seeds' mean reproduces"),
    ],
)
def test_the_verdict_rule_on_differences_with_a_known_answer(mean, sd, n, test, effect, verdict):
    """Per-seed differences with real spread: the interval is the t interval computed by hand and
    the verdict follows the paper's effect (holds above 0, does not hold only below E)."""
    from ar2dlm.reporting.claims import judge

    diffs = _spread(mean, sd, n)
    v = judge(diffs, test, effect)
    assert v.verdict.startswith(verdict), v.verdict
    assert v.mean == pytest.approx(mean) and v.sd == pytest.approx(sd)
    assert v.ci == pytest.approx(_interval(diffs))


def test_two_floors_or_two_ceilings_are_uninformative_not_a_verdict():
    from ar2dlm.reporting.claims import judge

    zeros = judge([0.0, 0.02, 0.01], "greater", 0.03, {"opd": 0.01, "opd_off": 0.0})
    assert zeros.verdict.startswith("uninformative (every run at the floor") and "opd 0.010" in zeros.verdict
    assert judge(_spread(0.01, 0.01, 3), "not_worse", 0.03, {"a": 0.97, "b": 0.99}).verdict.startswith(
        "uninformative (every run at the ceiling"
    )
    assert judge(_spread(0.25, 0.05, 3), "greater", 0.03, {"a": 0.3, "b": 0.05}).verdict == "holds"
    assert judge(_spread(-0.11, 0.01, 3), "greater", 2.0, None).verdict.startswith("does not hold")  # gamma: no scores


@pytest.mark.parametrize("effect, sd", [(0.061, 0.08), (0.03, 0.05), (0.0171, 0.02)])
def test_the_seeds_sized_detect_the_papers_effect_with_80_percent_power(effect, sd):
    """At the sized n, experiments whose true effect is the paper's reach 'holds' in about 80% of
    draws (simulated through the verdict itself), at n - 1 in fewer; and, with no true effect, the
    same n excludes the paper's effect ('does not hold') as often."""
    import numpy as np
    from scipy import stats

    from ar2dlm.reporting.claims import judge, seeds_for_power

    n = seeds_for_power(effect, sd)
    assert n is not None and n > 3

    def exact(k):
        return stats.nct.sf(stats.t.ppf(0.975, k - 1), k - 1, effect * k**0.5 / sd)

    assert exact(n) >= 0.8 > exact(n - 1)
    rng = np.random.default_rng(0)
    draws = 1500
    holds = sum(
        judge(list(rng.normal(effect, sd, n)), "greater", effect).verdict.startswith("holds") for _ in range(draws)
    )
    refuted = sum(
        judge(list(rng.normal(0, sd, n)), "greater", effect).verdict.startswith("does not hold") for _ in range(draws)
    )
    assert holds / draws == pytest.approx(exact(n), abs=0.035)
    assert refuted / draws == pytest.approx(exact(n), abs=0.035)


def test_an_inconclusive_claim_names_the_seeds_for_power_and_a_decided_one_none():
    from ar2dlm.reporting.claims import _sizing, judge, seeds_for_power

    wide = judge(_spread(0.05, 0.1, 4), "greater", 0.061)
    assert wide.verdict == "inconclusive"
    assert _sizing(wide, 0.061, 4, 0.0) == f"{seeds_for_power(0.061, 0.1)} (sd 0.1 from 4 seeds)"
    assert _sizing(judge(_spread(0.1, 0.02, 5), "greater", 0.061), 0.061, 5, 0.0) is None
    assert _sizing(judge(_spread(0.0, 5.0, 3), "greater", 0.01), 0.01, 3, 0.0).startswith("> 1000")
    two = _sizing(judge([0.1, 0.2], "greater", 0.061), 0.061, 2, 0.0)
    assert two == f"{seeds_for_power(0.061, 0.0707)} (sd 0.0707 from 2 seeds)"
    # a spread below the measure's rounding is sized at the rounding's
    level = judge([0.1, 0.1, 0.1], "greater", 0.15, step=0.15)  # [-0.008, +0.208]
    assert _sizing(level, 0.15, 3, 0.15).endswith("(sd 0.0433 from 3 seeds)")


@pytest.mark.parametrize(
    "mean, sd, n, verdict",
    [
        (0.10, 0.02, 5, "holds"),  # [0.075, 0.125]: clears E
        (0.03, 0.006, 5, "smaller than the paper's (the interval lies above 0 and below +0.061)"),  # [0.023, 0.037]
        (0.06, 0.02, 5, "inconclusive (above 0; the paper's +0.061 neither cleared nor excluded)"),  # [0.035, 0.085]
        (0.0, 0.015, 5, "does not hold (the paper's effect excluded, the interval lies below"),  # [-0.019, 0.019]
        (-0.1, 0.02, 3, "does not hold (the paper's effect excluded, reversed"),
    ],
)
def test_a_claim_that_states_a_size_holds_only_when_its_interval_clears_it(mean, sd, n, verdict):
    """The same intervals a direction reads as holding hold for a stated size only above it; above 0 and
    below the size they are smaller than the paper's."""
    from ar2dlm.reporting.claims import judge

    v = judge(_spread(mean, sd, n), "greater", 0.061, size=True)
    assert v.verdict.startswith(verdict), v.verdict
    assert v.ci == pytest.approx(_interval(_spread(mean, sd, n)))


def test_seeds_that_agree_exactly_are_judged_at_the_measures_resolution_and_a_coarse_measure_cannot_decide():
    """Six seeds of exactly 0 on 24 held-out pairs: the interval is the rounding's (step / sqrt(12) a seed),
    not a point; a measure whose step is coarser than the paper's effect decides nothing."""
    from scipy import stats

    from ar2dlm.reporting.claims import judge

    step = 1 / 24
    v = judge([0.0] * 6, "greater", 0.05, step=step)
    half = stats.t.ppf(0.975, 5) * step / 12**0.5 / 6**0.5
    assert v.ci == pytest.approx((-half, half)) and v.sd == 0.0
    assert v.verdict.startswith("does not hold") and 0 < v.p_bound < 0.05
    assert judge([0.0] * 6, "greater", 0.03).ci == (0.0, 0.0)  # a continuous measure: no rounding to widen it
    coarse = judge(_spread(0.05, 0.05, 4), "greater", 0.03, step=0.042)
    assert coarse.verdict == (
        "cannot decide (its step 0.042 is coarser than the paper's effect 0.03: 2x its items would resolve it)"
    )
    assert coarse.p_bound != coarse.p_bound  # not tested: outside Holm's family


def test_holm_adjusts_each_decided_verdict_over_the_claims_tested():
    from ar2dlm.reporting.claims import holm

    nan = float("nan")
    adjusted = holm([0.01, 0.04, nan, 1.0])
    assert adjusted[:2] == pytest.approx([0.03, 0.08]) and adjusted[3] == 1.0 and adjusted[2] != adjusted[2]


def test_best_other_lowest_threshold_equal_flops_and_the_teacher_floor_read_known_scores(tiny):
    """Claim-level branches on synthetic evaluations with real spread: best_other picks the best
    other run by its mean and pairs by seed; lowest_threshold averages the rows at the lowest
    threshold; equal_flops gives no verdict when the recipes' FLOPs differ by more than 15%; a
    teacher below the floor makes a claim uninformative; a relative effect is that percentage of the
    compared arm's mean."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    tiny["runs"]["ed_bidir"] = ED_BIDIR
    tiny["studies"]["efficient_dlm/tradeoff"].update(runs=["ed", "ed_bidir"], seeds=[0, 1, 2, 3])
    tiny["claims"]["judged"] = {
        "best": _claim(study="ablations/lambda", against="best_other", direction="near_best"),
        "lowest": _claim(
            study="efficient_dlm/tradeoff",
            run="ed",
            against="ed_bidir",
            benchmark="code_throughput",
            decoding="lowest_threshold",
            effect={"value": 10, "unit": "rel", "where": "t"},
        ),
        "flops": _claim(study="ablations/lambda", run="ra", against="best_other", equal_flops=True),
    }
    check_claims(resolve(tiny))
    noise = [0.02, -0.01, 0.0, -0.01]  # per seed, shared by every run: paired differences keep their own spread
    base = {"mdlm": 0.40, "ra_l1": 0.62, "ra": 0.60, "ra_l100": 0.50}
    own = {("ra", 0): 0.03, ("ra", 1): -0.04, ("ra", 2): 0.0, ("ra", 3): 0.01}  # ra minus ra_l1: -0.02 +- spread
    flops = {"mdlm": 1e12, "ra_l1": 1.3e12, "ra": 1.3e12, "ra_l100": 1.3e12}
    for path in map(Path, claim_inputs(resolve(tiny))):
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "train.json":
            path.write_text(json.dumps({"flops": {"total": flops[path.parts[3]]}}))
            continue
        run = "teacher" if path.name == "teacher.json" else path.parts[4]
        seed = None if run == "teacher" else int(path.parts[5].removeprefix("seed"))
        if path.parts[2] == "code_throughput":  # ed beats ed_bidir by 0.1 + 0.02 * seed at the lowest threshold
            low = {"teacher": 0.8, "ed": 0.5 + 0.02 * (seed or 0), "ed_bidir": 0.4}[run]
            rows = [{"threshold": 0.5, "base_pass@1": low + d} for d in (-0.05, 0.05)]
            rows.append({"threshold": 0.9, "base_pass@1": 0.95})  # the best row: what the default would read
            path.write_text(json.dumps({"rows": rows}))
            continue
        score = 0.8 if run == "teacher" else base[run] + noise[seed] + own.get((run, seed), 0.0)
        path.write_text(json.dumps({"metrics": {m: score for m in METRICS}}))
    df = evaluate_claims(resolve(tiny))[0].set_index("id")
    best = df.loc["best"]
    assert best["measure"] == "synthetic_code base_pass@1: ra minus the best other run (ra_l1)"
    assert best["seeds"] == 3 and best["effect"] == pytest.approx(-0.07 / 3, abs=1e-4)  # diffs +0.01, -0.06, -0.02
    low, high = _interval([0.01, -0.06, -0.02])
    assert best["95% CI"] == f"[{low:+.4f}, {high:+.4f}]" and best["verdict"] == "inconclusive"
    lowest = df.loc["lowest"]
    assert lowest["measure"].startswith("code_throughput base_pass@1 at the lowest threshold: ed minus ed_bidir")
    assert lowest["effect"] == pytest.approx(0.13) and lowest["paper effect"] == pytest.approx(0.04)  # 10% of 0.4
    assert lowest["verdict"] == "holds" and lowest["95% CI"] == "[{:+.4f}, {:+.4f}]".format(
        *_interval([0.1, 0.12, 0.14, 0.16])
    )
    assert df.loc["flops", "verdict"].startswith("not at equal FLOPs (mdlm 1e+12, ra_l1 1.3e+12")

    flops["mdlm"] = 1.2e12  # within 15%: a verdict again
    for s in (0, 1, 2):
        Path(f"results/models/tiny/mdlm/seed{s}/train.json").write_text(json.dumps({"flops": {"total": 1.2e12}}))
    assert not evaluate_claims(resolve(tiny))[0].set_index("id").loc["flops", "verdict"].startswith("not at equal")

    Path("results/eval/synthetic_code/tiny/teacher.json").write_text(json.dumps({"metrics": {m: 0.2 for m in METRICS}}))
    assert (
        evaluate_claims(resolve(tiny))[0]
        .set_index("id")
        .loc["best", "verdict"]
        .startswith("uninformative (the AR teacher itself scores 0.200 on synthetic_code")
    )


def test_fewer_than_three_seeds_say_whether_they_reproduce_the_papers_effect():
    """The paper preset's one seed: never a verdict, but read against the paper's effect (at least
    half of it for a greater claim, no loss beyond it for a not-worse one)."""
    from ar2dlm.reporting.claims import judge

    assert judge([0.04], "greater", 0.061).verdict == (
        "inconclusive (fewer than 3 seeds; the one seed reproduces the paper: +0.0400, "
        "at least 50% of the paper's +0.061)"
    )
    assert "the one seed does not reproduce the paper: +0.0200, below 50%" in judge([0.02], "greater", 0.061).verdict
    assert "the 2 seeds' mean does not reproduce the paper: -0.0600, beyond the tolerated loss 0.03" in (
        judge([-0.05, -0.07], "not_worse", 0.03).verdict
    )


def test_a_training_throughput_claim_reads_the_manifests_against_a_relative_effect(tiny):
    """benchmark: training reads each run's tokens over its training seconds (no evaluation, no
    teacher); a ~1.5x speed-up against the paper's ~2x (+100%) holds, noted as smaller than the paper's."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    tiny["claims"]["judged"] = {
        "thr": _claim(
            study="repr_align/freezing",
            run="ra_freeze",
            against="ra",
            benchmark="training",
            metric="tokens_per_s",
            effect={"value": 100, "unit": "rel", "where": "t"},
        )
    }
    check_claims(resolve(tiny))
    inputs = claim_inputs(resolve(tiny))
    assert inputs and all(p.endswith("train.json") for p in inputs)
    seconds = {"ra": [1.0, 1.1, 0.9], "ra_freeze": [0.7, 0.72, 0.61]}
    for path in map(Path, inputs):
        path.parent.mkdir(parents=True, exist_ok=True)
        run, seed = path.parts[3], int(path.parts[4].removeprefix("seed"))
        path.write_text(json.dumps({"tokens": 1000, "train_seconds": seconds[run][seed]}))
    row = evaluate_claims(resolve(tiny))[0].iloc[0]
    diffs = [1000 / f - 1000 / r for f, r in zip(seconds["ra_freeze"], seconds["ra"])]
    assert row["effect"] == pytest.approx(sum(diffs) / 3, abs=1e-3)
    assert row["paper effect"] == pytest.approx(sum(1000 / r for r in seconds["ra"]) / 3, abs=1e-3)  # 100% of ra's
    assert row["95% CI"] == "[{:+.4f}, {:+.4f}]".format(*_interval(diffs))
    assert row["verdict"].startswith("holds (an effect smaller than the paper's")  # faster, but not 2x
    tiny["claims"]["judged"]["thr"]["against"] = "teacher"
    with pytest.raises(ConfigError, match=r"claims\.judged\.thr\.against.*no conversion run"):
        check_claims(resolve(tiny))


def test_spectral_shadowing_reads_the_spectra_in_orders_of_magnitude(tiny):
    """The shadowing measure is log10 of the median over weight matrices of tau_diffusion's spectral
    norm over tau_pref's, one difference per seed (the mean over its domains), judged against one order
    of magnitude; it names no merge (the spectra come before any)."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    shadow = {**_armap_claim("shadowing"), "effect": {"value": 1, "where": "t"}}
    del shadow["armap"]["merge"]
    tiny["claims"]["judged"] = {"shadow": shadow}
    check_claims(resolve(tiny))
    inputs = claim_inputs(resolve(tiny))
    assert len(inputs) == 6 and all(p.endswith("spectra.csv") for p in inputs)  # 3 seeds x code, math
    for i, path in enumerate(map(Path, inputs)):
        path.parent.mkdir(parents=True, exist_ok=True)
        # median 10 ** (2 + 0.1 i); a matrix LoRA leaves untouched has no ratio (inf) and is left out
        ratios = [10 ** (1.5 + 0.1 * i), 10 ** (2.0 + 0.1 * i), 1e9, float("inf"), float("inf")]
        path.write_text("parameter,shadowing_ratio\n" + "".join(f"w{k},{r}\n" for k, r in enumerate(ratios)))
    row = evaluate_claims(resolve(tiny))[0].iloc[0]
    assert row["seeds"] == 3 and row["effect"] == pytest.approx(2.25)  # per seed 2.05, 2.25, 2.45
    assert row["differences"] == "+2.050, +2.250, +2.450"
    assert row["verdict"] == "holds" and row["paper effect"] == 1 and row["step"] == 0.0
    shadow["armap"]["merge"] = "task_arithmetic"
    with pytest.raises(ConfigError, match=r"claims\.judged\.shadow\.armap\.merge.*before any merge"):
        check_claims(resolve(tiny))


def test_a_claim_on_several_benchmarks_reads_the_mean_over_those_the_teacher_can_do(tiny):
    """benchmark: [..], metric: headline: each run's score is the mean of the benchmarks' headline
    metrics (pass@1, accuracy) over those the AR teacher scores at least the floor on; the others are
    named in the measure; none left: uninformative."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    benches = ["synthetic_code", "arith_choice", "arithmetic"]
    tiny["runs"]["ed_bidir"] = ED_BIDIR
    tiny["studies"]["efficient_dlm/attention"] = {"runs": ["ed", "ed_bidir"], "evals": benches, "seeds": [0, 1, 2]}
    tiny["claims"]["judged"] = {
        "mean": _claim(
            study="efficient_dlm/attention",
            run="ed",
            against="ed_bidir",
            benchmark=benches,
            metric="headline",
            effect={"value": 19, "unit": "rel", "where": "t"},
        )
    }
    check_claims(resolve(tiny))
    teacher = {"synthetic_code": 0.8, "arith_choice": 0.6, "arithmetic": 0.17}
    gap = {"synthetic_code": [0.1, 0.2, 0.3], "arith_choice": [0.0, 0.05, 0.1], "arithmetic": [-0.5, -0.5, -0.5]}
    for path in map(Path, claim_inputs(resolve(tiny))):
        path.parent.mkdir(parents=True, exist_ok=True)
        bench, run = path.parts[2], "teacher" if path.name == "teacher.json" else path.parts[4]
        seed = None if run == "teacher" else int(path.parts[5].removeprefix("seed"))
        score = teacher[bench] if run == "teacher" else 0.4 + (gap[bench][seed] if run == "ed" else 0.0)
        path.write_text(json.dumps({"metrics": {m: score for m in METRICS}}))
    row = evaluate_claims(resolve(tiny))[0].iloc[0]
    assert row["measure"] == (
        "mean headline score over synthetic_code, arith_choice (left out, the AR teacher below 0.3: "
        "arithmetic (0.170)): ed minus ed_bidir"
    )
    diffs = [(0.1 + 0.0) / 2, (0.2 + 0.05) / 2, (0.3 + 0.1) / 2]
    assert row["effect"] == pytest.approx(sum(diffs) / 3, abs=1e-4) and row["paper effect"] == pytest.approx(0.076)
    assert row["95% CI"] == "[{:+.4f}, {:+.4f}]".format(*_interval(diffs))
    tiny["claims"]["judged"]["mean"]["metric"] = "base_pass@1"
    with pytest.raises(ConfigError, match=r"claims\.judged\.mean\.metric.*several benchmarks reads each one's"):
        check_claims(resolve(tiny))
    tiny["claims"]["judged"]["mean"]["metric"] = "headline"
    teacher.update(synthetic_code=0.1, arith_choice=0.2)
    Path("results/eval/synthetic_code/tiny/teacher.json").write_text(json.dumps({"metrics": {m: 0.1 for m in METRICS}}))
    Path("results/eval/arith_choice/tiny/teacher.json").write_text(json.dumps({"metrics": {m: 0.2 for m in METRICS}}))
    assert (
        evaluate_claims(resolve(tiny))[0]
        .iloc[0]["verdict"]
        .startswith("uninformative (the AR teacher itself scores below 0.3 on every benchmark")
    )


def test_a_speed_claim_reads_the_row_at_the_benchmarks_threshold_against_the_teachers_one_row(tiny):
    """tokens/s and tokens per step are claimable on a throughput benchmark, as numbers, not scores (no
    floor, ceiling or teacher floor); default_threshold reads the DLM's row at the benchmark's own
    threshold, lowest_threshold its most aggressive; the AR teacher writes one row (threshold None)."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    tiny["claims"]["judged"] = {
        "speed": _claim(
            study="efficient_dlm/tradeoff",
            run="ed",
            against="teacher",
            benchmark="code_throughput",
            metric="tokens_per_s",
            decoding="default_threshold",
            effect={"value": 170, "unit": "rel", "where": "t"},
        ),
        "steps": _claim(
            study="opdlm/tradeoff",
            run="opd",
            against="teacher",
            benchmark="code_throughput",
            metric="tokens_per_step",
            decoding="lowest_threshold",
            effect={"value": 1, "where": "t"},
        ),
    }
    check_claims(resolve(tiny))
    for path in map(Path, claim_inputs(resolve(tiny))):
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "teacher.json":  # AR: one row, 100 tokens/s, one token a step, pass@1 0.1 (below any floor)
            rows = [{"threshold": None, "tokens_per_s": 100.0, "tokens_per_step": 1.0, "base_pass@1": 0.1}]
        else:
            seed = int(path.parts[5].removeprefix("seed"))
            rows = [
                {
                    "threshold": t,
                    "tokens_per_s": speed + 10 * seed,
                    "tokens_per_step": per_step + 0.1 * seed,
                    "base_pass@1": 0.5,
                }
                for t, speed, per_step in ((0.5, 400.0, 3.0), (0.7, 300.0, 2.5), (0.9, 150.0, 1.5), (1.0, 90.0, 1.0))
            ]
        path.write_text(json.dumps({"rows": rows}))
    df = evaluate_claims(resolve(tiny))[0].set_index("id")
    speed = df.loc["speed"]
    assert speed["measure"] == "code_throughput tokens_per_s at the default threshold: ed minus teacher"
    assert speed["effect"] == pytest.approx(60.0) and speed["paper effect"] == pytest.approx(170.0)  # 1.7 x 100
    assert speed["verdict"].startswith("holds (an effect smaller than the paper's")  # faster: 1.6x, not 2.7x
    steps = df.loc["steps"]
    assert steps["effect"] == pytest.approx(2.1) and steps["verdict"] == "holds"


def test_transfer_against_no_vector_and_against_gamma_one_read_the_gamma_curve(tiny):
    """vs_no_transfer: held-out reward accuracy at gamma_hat minus at gamma 0 (TIES and DARE claims);
    vs_gamma_one: minus at gamma 1; above_one: at the best gamma above 1 minus the best at or below 1,
    chosen on the search pairs; one difference per seed, the mean over its domains, its step 1 / (test
    pairs x domains); a grid without the reference gamma is refused by key."""
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.reporting.claims import claim_inputs, evaluate_claims

    tiny["claims"]["judged"] = {
        "none": _armap_claim("vs_no_transfer"),
        "one": _armap_claim("vs_gamma_one"),
        "above": _armap_claim("above_one"),
    }
    check_claims(resolve(tiny))
    for path in map(Path, claim_inputs(resolve(tiny))):
        path.parent.mkdir(parents=True, exist_ok=True)
        seed, code = int(path.parts[-4].removeprefix("seed")), path.parts[-3] == "code"
        # (search, test) accuracy: gamma_hat 3 on the search pairs; above 1, 3 beats 4 there and 4 wins on test
        three = 0.6 + 0.01 * seed + 0.02 * code
        acc = {0: (0.5, 0.5), 0.5: (0.52, 0.7), 1: (0.55, 0.55), 3: (0.6, three), 4: (0.58, 0.9)}
        curve = [{"gamma": g, "reward_accuracy": a, "test_reward_accuracy": t} for g, (a, t) in acc.items()]
        path.write_text(json.dumps({"gamma_hat": 3, "curve": curve, "test_pairs": 25}))
    df = evaluate_claims(resolve(tiny))[0].set_index("id")
    assert df.loc["none", "seeds"] == 3 and df.loc["none", "effect"] == pytest.approx(0.12)  # code +0.02, math 0
    assert df.loc["none", "differences"] == "+0.110, +0.120, +0.130"
    assert df.loc["one", "effect"] == pytest.approx(0.07) and df.loc["one", "step"] == pytest.approx(0.02)
    assert df.loc["above", "effect"] == pytest.approx(0.07)  # 3 (not 4) against 1 (not 0.5): the search pairs chose
    tiny["armap"]["gamma"]["grid"] = [0.5, 1, 2]
    with pytest.raises(ConfigError, match=r"armap\.gamma\.grid.*compares with gamma 0"):
        check_claims(resolve(tiny))


@pytest.mark.parametrize(
    "keys, where, words",
    [
        ({"metric": "headline"}, "metric", "'headline' is the metric of a claim on a list of benchmarks"),
        (
            {"benchmark": ["synthetic_code", "arith_choice"], "metric": "headline", "decoding": "lowest_threshold"},
            "decoding",
            "reads each one's headline",
        ),
        (
            {
                "study": "opdlm/tradeoff",
                "run": "opd",
                "against": "teacher",
                "benchmark": "code_throughput",
                "metric": "tokens_per_step",
            },
            "decoding",
            "the fastest setting whatever its accuracy",
        ),
    ],
)
def test_claims_the_judge_cannot_read_are_refused_by_key(tiny, keys, where, words):
    from ar2dlm.pipeline.checks import check_claims
    from ar2dlm.pipeline.config import ConfigError

    tiny["studies"]["repr_align/code"]["evals"].append("arith_choice")
    tiny["claims"]["judged"] = {"bad": _claim(**keys)}
    with pytest.raises(ConfigError, match=rf"claims\.judged\.bad\.{where}.*{words}"):
        check_claims(resolve(tiny))
