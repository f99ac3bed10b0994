"""The papers' directional claims, tested on this preset's results.

Each claim compares run ``a`` with run ``b`` (or the AR teacher) of one study on the study's first
benchmark and first model, paired by seed: effect = mean over seeds of the differences (a - b),
spread = their standard deviation. The statistics are scipy's: a paired t-test
(``scipy.stats.ttest_1samp`` on the per-seed differences, which is ``ttest_rel`` on the pairs) and
the 95% t confidence interval of the mean difference. Verdicts (``VERDICT_RULE``):

- ``greater``: holds when the interval lies above 0, does not hold when it lies below 0 or every
  difference is <= 0 with no spread, else inconclusive.
- ``not_worse``: holds when the effect is >= 0, does not hold when the interval lies below 0, else
  inconclusive. ``near_best``: the same, a against the best other run of the study.
- With a margin m (``claims.min_effect``: how far the same run's score moves between machines, the
  smallest effect worth a verdict), a ``greater`` claim holds only when its mean effect is also at
  least m, and does not hold once its interval lies below m (no gain beyond the spread); for
  ``not_worse`` and ``near_best`` an effect down to -m counts as no worse (holds). m = 0 is the
  plain rule.
- Fewer than 3 seeds: inconclusive.
- Every compared run's mean below 0.05 or every one above 0.95 on the claim's metric (a score in
  [0, 1]): degenerate, never a verdict (two floors, or two ceilings, compared).
- The AR teacher itself below ``claims.teacher_floor`` (default 0.3) on that metric: uninformative,
  never a verdict (the runs are conversions of it; a benchmark it cannot do cannot show what they
  keep).

An inconclusive claim is sized (``seeds_to_decide``): the fewest seeds whose interval, at the
measured effect and per-seed spread, would decide it (exclude 0, or lie below m).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..pipeline import layout
from ..pipeline.jobs import armap_dlms, study_members, study_models, study_seeds
from ..pipeline.runs import resolve_run
from ..provenance import read_json
from .tables import headline_metric, headline_value

CONFIDENCE = 0.95
MIN_SEEDS = 3
FLOOR, CEILING = 0.05, 0.95  # a study whose compared runs all score outside these decides nothing
TEACHER_FLOOR = 0.3  # default claims.teacher_floor: a benchmark the AR teacher scores below it shows nothing
UNBOUNDED = ("likelihood",)  # benchmark kinds whose headline metric is not a score in [0, 1]
VERDICT_RULE = (f"paired t-test on the per-seed differences (scipy.stats) and the {CONFIDENCE:.0%} t confidence "
                "interval of their mean. greater: holds when the interval lies above 0, does not hold when it lies "
                "below 0 (or every difference is <= 0 with no spread); not_worse and near_best: hold when the mean "
                f"difference is >= 0, do not hold when the interval lies below 0; otherwise, or with fewer than "
                f"{MIN_SEEDS} seeds, inconclusive; with a margin m (the spread between machines) a greater claim "
                "holds only at a mean difference >= m and does not hold once its interval lies below m, and a mean "
                "difference down to -m counts as no worse; every compared run's mean below "
                f"{FLOOR} or above {CEILING} on the claim's metric: degenerate; the AR teacher itself below "
                "the teacher floor (claims.teacher_floor, default 0.3) on it: uninformative")


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    text: str
    study: str  # a key of studies, or "armap" (read from AR-MAP's gamma searches)
    a: str | tuple[str, ...] | None  # the run that should win: the first of these the study has (None: its first run)
    b: str | tuple[str, ...] | None  # the run it is compared with (the first the study has), "teacher", or None: the best other run
    test: str  # greater, not_worse or near_best
    option: str | None = None  # lowest_threshold (throughput rows), equal_flops, gamma_hat or vs_gamma_one (AR-MAP)


CLAIMS = [
    Claim("align_beats_no_align", "REPR-ALIGN", "REPR-ALIGN beats AR-initialised MDLM without alignment at equal steps",
          "repr_align/code", "ra", "mdlm", "greater"),
    Claim("cosine_beats_l2", "REPR-ALIGN", "cosine alignment beats L2", "repr_align/metric", "ra", "ra_mse", "greater"),
    Claim("lambda10_near_best", "REPR-ALIGN", "lambda = 10 is at or near the best lambda", "ablations/lambda", "ra",
          None, "near_best"),
    Claim("freezing_keeps_quality", "REPR-ALIGN",
          "freezing embeddings and MLPs keeps quality (its training tokens/s: the study table)",
          "repr_align/freezing", "ra_freeze", "ra", "not_worse"),
    Claim("subset_align_beats_stream", "REPR-ALIGN", "the small subset with alignment beats the larger stream without",
          "repr_align/data", "ra", "mdlm_stream", "greater"),
    Claim("on_policy_beats_off_policy", "OPDLM", "on-policy distillation beats off-policy", "opdlm/policy",
          ("opd", "opd_math"), "opd_off", "greater"),  # the paper preset compares both on MATH prompts
    # the tiny preset compares shifted runs (no-shift runs there are still relearning their output mapping)
    Claim("block_beats_bidirectional", "Efficient-DLM", "block attention with clean context beats bidirectional",
          "efficient_dlm/attention", ("ed", "ed_shift"), ("ed_bidir", "ed_shift_bidir"), "greater"),
    Claim("positional_masking_aggressive", "Efficient-DLM",
          "position-dependent masking beats uniform masking at the most aggressive threshold", "efficient_dlm/masking",
          ("ed", "ed_shift"), ("ed_uniform", "ed_shift_uniform"), "greater", "lowest_threshold"),
    Claim("no_shift_not_worse", "Efficient-DLM", "no shift is at least as good as shift", "efficient_dlm/shift", "ed",
          "ed_shift", "not_worse"),
    Claim("dlm_embeddings_beat_ar", "Efficient-DLM", "DLM embeddings beat the AR teacher's embeddings",
          "efficient_dlm/embeddings", None, "teacher", "greater"),
    Claim("combined_beats_single", "combined",
          "the combined recipe (on-policy distillation into a block-attention student with clean context, plus "
          "alignment) beats every single recipe at equal training FLOPs", "combined", "combined", None, "greater", "equal_flops"),
    Claim("armap_gamma_above_one", "AR-MAP", "the best gamma is above 1", "armap", None, None, "greater", "gamma_hat"),
    Claim("armap_beats_plain_transfer", "AR-MAP", "gamma_hat beats plain transfer (gamma = 1) on held-out test pairs",
          "armap", None, None, "greater", "vs_gamma_one"),
]
CLAIM_MERGE = "task_arithmetic"  # AR-MAP's claims read this merge's gamma searches


def _value(config, bench, model, run, seed, option, step=None):
    """A run's score at ``step`` (default: its final step), or the teacher's."""
    step = None if run == "teacher" else step or resolve_run(config, run)["training"]["steps"]
    res = read_json(layout.eval_path(bench, model, run, seed, step))
    if option == "lowest_threshold":
        lowest = min(r["threshold"] for r in res["rows"])
        return sum(r["base_pass@1"] for r in res["rows"] if r["threshold"] == lowest) / \
            sum(1 for r in res["rows"] if r["threshold"] == lowest)
    return headline_value(config, bench, res)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    mean: float
    sd: float
    ci: tuple[float, float]
    p: float  # two-sided paired t-test of mean difference 0


def verdict(diffs: list[float], test: str, margin: float = 0.0) -> Verdict:
    """The verdict on paired differences a - b under ``test``, effects within +-``margin`` read as
    no difference (the rule: VERDICT_RULE)."""
    from scipy import stats

    if test not in ("greater", "not_worse", "near_best"):
        raise ValueError(f"unknown test {test!r} (known: greater, not_worse, near_best)")
    n = len(diffs)
    s = pd.Series(diffs, dtype=float)
    mean, sd = float(s.mean()), float(s.std()) if n > 1 else float("nan")
    if n < 2:
        return Verdict(f"inconclusive (fewer than {MIN_SEEDS} seeds)", mean, sd, (float("nan"), float("nan")),
                       float("nan"))
    if sd == 0:  # t is undefined; the interval is the point itself
        ci, p = (mean, mean), (1.0 if mean == 0 else 0.0)
    else:
        res = stats.ttest_1samp(diffs, 0.0)
        low, high = res.confidence_interval(CONFIDENCE)
        ci, p = (float(low), float(high)), float(res.pvalue)
    if n < MIN_SEEDS:
        return Verdict(f"inconclusive (fewer than {MIN_SEEDS} seeds)", mean, sd, ci, p)
    if test == "greater":
        if ci[1] < 0 or (sd == 0 and mean <= 0):
            v = "does not hold"
        elif margin > 0 and ci[1] < margin:
            v = f"does not hold (no gain beyond the cross-machine spread: the interval lies below +{margin:g})"
        elif ci[0] > 0 and mean >= margin:
            v = "holds"
        else:
            v = "inconclusive"
    else:
        v = "holds" if mean >= -margin else ("does not hold" if ci[1] < 0 else "inconclusive")
    return Verdict(v, mean, sd, ci, p)


MAX_SEEDS = 1000  # beyond this the effect is too small against its spread to size


def seeds_to_decide(mean: float, sd: float, margin: float = 0.0, test: str = "greater") -> int | None:
    """The fewest seeds n (>= MIN_SEEDS) at which a mean difference ``mean`` with per-seed spread
    ``sd`` is decided: its t interval, of half-width t(0.975, n - 1) * sd / sqrt(n), excludes 0
    (an effect beyond the margin) or, for a ``greater`` claim whose effect lies below the margin
    m, lies below m (half-width < m - mean). None when no number up to MAX_SEEDS would (no
    effect, or one lost in its spread); MIN_SEEDS when there is no spread."""
    from scipy import stats  # here, not at the top: the DAG build imports this module for claim_inputs

    if math.isnan(mean) or math.isnan(sd):
        return None
    target = margin - mean if test == "greater" and margin > 0 and mean < margin else abs(mean)
    if target == 0:
        return None
    if sd == 0:
        return MIN_SEEDS
    ok = lambda n: stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n) < target  # noqa: E731
    if not ok(MAX_SEEDS):
        return None
    lo, hi = MIN_SEEDS, MAX_SEEDS  # the half-width falls with n: bisect for the first n that decides
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def judge(diffs: list[float], test: str, arms: dict[str, float] | None = None, margin: float = 0.0) -> Verdict:
    """``verdict``, unless the runs compared (``arms``: each run's mean on the claim's metric, a
    score in [0, 1]) all sit at the floor or all at the ceiling: then the study is degenerate."""
    v = verdict(diffs, test, margin)
    if arms and len(diffs) >= MIN_SEEDS and (all(m < FLOOR for m in arms.values()) or all(m > CEILING for m in arms.values())):
        where = "floor" if all(m < FLOOR for m in arms.values()) else "ceiling"
        means = ", ".join(f"{r} {m:.3f}" for r, m in arms.items())
        return Verdict(f"degenerate (every run at the {where}: {means})", v.mean, v.sd, v.ci, v.p)
    return v


def _paired_seeds(config: dict, spec: dict, runs: list[str]) -> list[int]:
    """The seeds every one of the compared runs has in the study (differences are paired by seed)."""
    return sorted(set.intersection(*(set(study_seeds(config, spec, r)) for r in runs)))


def claim_inputs(config: dict) -> list[str]:
    """The evaluation and AR-MAP files the claims read: every run of each claim's study on the
    study's first benchmark at its final step (at every evaluated step where the study evaluates
    all checkpoints; with the runs' manifests for an equal-FLOPs claim), the teacher, and the
    AR-MAP gamma curves."""
    paths = [layout.gamma_curve(*d, pd_, CLAIM_MERGE) for d in armap_dlms(config) for pd_ in config["armap"]["domains"]]
    for study in sorted({c.study for c in CLAIMS} & set(config["studies"])):
        spec = config["studies"][study]
        bench, model = spec["evals"][0], study_models(config, spec)[0]
        paths.append(layout.eval_path(bench, model, "teacher"))
        flops_compared = any(c.option == "equal_flops" for c in CLAIMS if c.study == study)
        for m in study_members(config, study):
            if m.model == model:
                paths += [layout.eval_path(bench, model, m.run, s, k) for s in m.seeds for k in m.steps]
                if flops_compared:
                    paths += [layout.conversion_manifest(model, m.run, s) for s in m.seeds]
    return sorted(set(paths))


def _armap_differences(config: dict, option: str) -> tuple[list[float], str]:
    diffs = []
    for d in armap_dlms(config):
        for pd_ in config["armap"]["domains"]:
            g = read_json(layout.gamma_curve(*d, pd_, CLAIM_MERGE))
            if option == "gamma_hat":
                diffs.append(g["gamma_hat"] - 1.0)
            else:
                test_curve = {c["gamma"]: c["test_reward_accuracy"] for c in g["curve"]}
                diffs.append(test_curve[g["gamma_hat"]] - test_curve.get(1, test_curve.get(1.0)))
    measure = "gamma_hat - 1" if option == "gamma_hat" else "test reward accuracy at gamma_hat minus at gamma 1"
    return diffs, measure


def _first_present(names: str | tuple[str, ...], spec: dict) -> str:
    names = (names,) if isinstance(names, str) else names
    return next((r for r in names if r in spec["runs"]), names[0])


def winner(c: Claim, spec: dict) -> str:
    """The run of the study that should win the claim."""
    return spec["runs"][0] if c.a is None else _first_present(c.a, spec)


def loser(c: Claim, spec: dict) -> str | None:
    """The run the winner is compared with, "teacher", or None (the best other run of the study)."""
    return c.b if c.b in (None, "teacher") else _first_present(c.b, spec)


def _study_differences(config: dict, c: Claim, spec: dict) -> tuple[list[float], str, dict[str, float]]:
    """Per-seed differences, what they measure, and each compared run's mean."""
    bench, model = spec["evals"][0], study_models(config, spec)[0]
    metric = headline_metric(config, bench)
    a, b = winner(c, spec), loser(c, spec)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    if b is None:  # against the best other run of the study (by its mean over the paired seeds)
        seeds = _paired_seeds(config, spec, spec["runs"])
        means = {r: [_value(config, bench, model, r, s, c.option) for s in seeds] for r in spec["runs"]}
        best = max((r for r in spec["runs"] if r != a), key=lambda r: sum(means[r]))
        return [x - y for x, y in zip(means[a], means[best])], \
            f"{bench} {metric}: {a} minus the best other run ({best})", \
            {r: mean(v) for r, v in means.items()} if config["eval"]["benchmarks"][bench]["kind"] not in UNBOUNDED else None
    seeds = _paired_seeds(config, spec, [a] + ([] if b == "teacher" else [b]))
    va = [_value(config, bench, model, a, s, c.option) for s in seeds]
    vb = [_value(config, bench, model, b, None if b == "teacher" else s, c.option) for s in seeds]
    measure = f"{bench} {metric}" + (" at the lowest threshold" if c.option == "lowest_threshold" else "") + \
        f": {a} minus {b}"
    arms = {a: mean(va), b: mean(vb)} if config["eval"]["benchmarks"][bench]["kind"] not in UNBOUNDED else None
    return [x - y for x, y in zip(va, vb)], measure, arms


def effect_by_step(config: dict, c: Claim, spec: dict) -> dict[int, list[float]]:
    """The claim's per-seed differences (a - b, paired seeds) at every training step both runs
    were evaluated at: the study evaluates all checkpoints (``checkpoints: all``) and the runs
    share a step budget. Empty otherwise."""
    a, b = winner(c, spec), loser(c, spec)
    if spec.get("checkpoints") != "all" or b in ("teacher", None):
        return {}
    bench, model = spec["evals"][0], study_models(config, spec)[0]
    steps = {m.run: m.steps for m in study_members(config, c.study) if m.model == model}
    seeds = _paired_seeds(config, spec, [a, b])
    out = {}
    for k in sorted(set(steps[a]) & set(steps[b])):
        out[k] = [_value(config, bench, model, a, s, c.option, k) - _value(config, bench, model, b, s, c.option, k)
                  for s in seeds]
    return out


def teacher_below_floor(config: dict, c: Claim, spec: dict) -> str | None:
    """Why a claim's benchmark cannot decide it: the AR teacher's own score there is below
    ``claims.teacher_floor`` (default TEACHER_FLOOR; None when it is not)."""
    floor = config.get("claims", {}).get("teacher_floor", TEACHER_FLOOR)
    bench, model = spec["evals"][0], study_models(config, spec)[0]
    score = _value(config, bench, model, "teacher", None, None)  # its one decoding setting
    if score < floor:
        return (f"uninformative (the AR teacher itself scores {score:.3f} on {bench}, below {floor}: "
                "choose a benchmark it can do)")
    return None


FLOPS_TOLERANCE = 1.15  # an equal-FLOPs claim's runs may differ this much in training FLOPs (rollouts vary)


def unequal_flops(config: dict, spec: dict, runs: list[str]) -> str | None:
    """Why the runs of an equal-FLOPs comparison are not at equal compute (their recipes' training
    FLOPs, stages before them included, differ by more than FLOPS_TOLERANCE), or None."""
    from .tables import recipe_flops

    model = study_models(config, spec)[0]
    seeds = _paired_seeds(config, spec, runs)
    flops = {r: sum(recipe_flops(read_json(layout.conversion_manifest(model, r, s))) for s in seeds) / len(seeds)
             for r in runs}
    if max(flops.values()) > FLOPS_TOLERANCE * min(flops.values()):
        return "not at equal FLOPs (" + ", ".join(f"{r} {f:.3g}" for r, f in flops.items()) + ")"
    return None


def _sizing(v: Verdict, test: str, margin: float = 0.0) -> str | None:
    """For an inconclusive verdict, the seeds that would decide it at the measured effect and spread."""
    if not v.verdict.startswith("inconclusive"):
        return None
    if math.isnan(v.sd):
        return "unsized (one seed measures no spread)"
    n = seeds_to_decide(v.mean, v.sd, margin, test)
    return f"> {MAX_SEEDS} (effect {v.mean:+.4f} lost in its spread)" if n is None else str(n)


def evaluate_claims(config: dict) -> tuple[pd.DataFrame, dict[str, dict[int, list[float]]]]:
    """The claims table, and the per-seed effects by training step of the claims whose study
    evaluates every checkpoint (by claim id: the by-step figure)."""
    rows, curves = [], {}
    for c in CLAIMS:
        base = {"id": c.id, "paper": c.paper, "claim": c.text, "study": c.study}
        arms, by_step = None, {}  # AR-MAP's claims read gamma and reward accuracy differences, not run scores
        spec = config["studies"].get(c.study, {})
        if c.study == "armap":
            diffs, measure = _armap_differences(config, c.option)
        elif spec and {winner(c, spec), loser(c, spec)} - {"teacher", None} <= set(spec["runs"]):
            diffs, measure, arms = _study_differences(config, c, spec)
            if curve := effect_by_step(config, c, spec):
                curves[c.id] = curve
            by_step = {k: sum(d) / len(d) for k, d in curve.items()}
        else:
            rows.append({**base, "verdict": "not run in this preset"})
            continue
        margin = config.get("claims", {}).get("min_effect", 0.0) if arms is not None else 0.0
        v = judge(diffs, c.test, arms, margin)
        # no verdict where the comparison cannot decide it; the most basic reason is the one given
        compared = spec.get("runs", []) if c.b is None else [winner(c, spec), loser(c, spec)]
        if c.option == "equal_flops" and (why := unequal_flops(config, spec, compared)):
            v = Verdict(why, v.mean, v.sd, v.ci, v.p)
        if arms is not None and c.b != "teacher" and (low := teacher_below_floor(config, c, spec)):
            v = Verdict(low, v.mean, v.sd, v.ci, v.p)
        nan = lambda x: None if math.isnan(x) else round(x, 4)  # noqa: E731
        rows.append({**base, "measure": measure, "test": c.test, "seeds": len(diffs), "effect": round(v.mean, 4),
                     "spread (sd)": nan(v.sd), f"{CONFIDENCE:.0%} CI": None if math.isnan(v.ci[0]) else
                     f"[{v.ci[0]:+.4f}, {v.ci[1]:+.4f}]", "p (paired t)": nan(v.p),
                     "differences": ", ".join(f"{d:+.3f}" for d in diffs), "verdict": v.verdict,
                     "seeds to decide": _sizing(v, c.test, margin),
                     "effect by training step": ", ".join(f"{k}: {d:+.3f}" for k, d in by_step.items()) or None})
    return pd.DataFrame(rows), curves


def claims_markdown(df: pd.DataFrame, preset: str) -> str:
    head = [f"# Claims of the four papers, tested on the {preset} preset", "",
            "Each row compares two runs of one study, paired by seed. Measured here at this preset's scale: a verdict "
            "says what these runs show, not what the papers found.", "", f"Verdict rule: {VERDICT_RULE}.", "",
            "An inconclusive row's 'seeds to decide' is the fewest seeds whose interval would decide it (exclude 0, "
            "or lie below the margin) at its "
            "measured effect and per-seed spread. Where a study evaluates every checkpoint, 'effect by training step' "
            "gives the mean difference at each step; the verdict is read at the largest budget, the final step.", ""]
    return "\n".join(head + [df.to_markdown(index=False), ""])
