"""The judge of the papers' directional claims, on this preset's results.

The claims are config (``claims.judged``, beside the studies they judge; the schema says each
key): a claim compares ``run`` with ``against`` (another run of its study, the AR teacher, or the
best other run) on one benchmark's metric and one model, paired by seed: effect = mean over seeds
of the differences (run - against), spread = their standard deviation; or it reads AR-MAP's gamma
searches. This module only judges them. The statistics are scipy's: a paired t-test
(``scipy.stats.ttest_1samp`` on the per-seed differences, which is ``ttest_rel`` on the pairs) and
the 95% t confidence interval of the mean difference. Each claim names the paper's effect E
(``effect``: the paper's number, in the claim's measure or relative to the compared arm, or a
stated effect with its reason where the paper gives none), and whether its sentence states that size
(``effect.size``). Verdicts (``VERDICT_RULE``), the same rule for every claim, with S = E for a claim
that states a size and S = 0 for one that states a direction:

- ``greater``: holds when the interval lies above S (for a direction, noted when it also lies below
  E: a smaller effect than the paper's); a size claim whose interval lies above 0 and below E reads
  "smaller than the paper's"; does not hold when the interval lies below E and does not clear 0
  (smaller than claimed, or reversed); else inconclusive.
- ``not_worse`` (``near_best``: against the best other run of the study): E is the loss the claim
  tolerates; holds when the interval lies above -E, does not hold when it lies below -E, else
  inconclusive.
- A measure's resolution (``step``: one per-seed difference moves by at least this much, 1 / tasks
  for a score over tasks, 1 / pairs for a reward accuracy) bounds the spread it is judged with from
  below (step / sqrt(12), the spread of rounding to that step): seeds that agree exactly are not an
  interval of width 0. A measure whose step is coarser than E cannot decide the claim.
- Fewer than 3 seeds: inconclusive, with whether their mean reproduces the paper's effect (at least
  half of E; for not_worse, no loss beyond E): the paper preset runs one seed.
- Every compared run's mean below 0.05 or every one above 0.95 on the claim's metric (a score in
  [0, 1]): uninformative, never a verdict (two floors, or two ceilings, compared).
- The AR teacher itself below ``claims.teacher_floor`` (default 0.3) on that metric: uninformative,
  never a verdict (the runs are conversions of it; a benchmark it cannot do cannot show what they
  keep).

A claim's replicate is the seed: AR-MAP's DLMs, domains and benchmarks of one seed are averaged into
one difference. Beside each verdict the report gives it after Holm's correction over the preset's
claims (the p-value of the bound the verdict crossed, times the claims still in the family).

An inconclusive claim is sized (``seeds_for_power``): the fewest seeds at which the paired t-test
detects the paper's effect with 80% power at the measured per-seed spread (the same seeds exclude
E with 80% power were the true effect 0); the report names the spread and the seeds it rests on.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import pandas as pd

from ..armap.choice import best_point
from ..pipeline import layout
from ..pipeline.claims import BEST_OTHER, TEACHER, TRAINING, Claim
from ..pipeline.jobs import dlm_dpo_seeds
from ..pipeline.resolved import Resolved, Study
from ..provenance import read_json
from .armap import DIRECT_LABELS

CONFIDENCE = 0.95
MIN_SEEDS = 3
FLOOR, CEILING = 0.05, 0.95  # a study whose compared runs all score outside these decides nothing
TEACHER_FLOOR = 0.3  # default claims.teacher_floor: a benchmark the AR teacher scores below it shows nothing
POWER = 0.8  # an inconclusive claim is sized for this power at the paper's effect
REPRODUCED = 0.5  # a reading on fewer than MIN_SEEDS seeds reproduces the paper when it reaches this share of E
VERDICT_RULE = (
    f"paired t-test on the per-seed differences (scipy.stats) and the {CONFIDENCE:.0%} t confidence "
    "interval of their mean, against the paper's effect E (the claim's 'paper effect') and the size S its "
    "sentence states (E for a stated size, 0 for a stated direction). greater: holds when the interval lies "
    "above S; a size claim whose interval lies above 0 and below E is smaller than the paper's; does not hold "
    "when the interval lies below E and does not clear 0 (smaller than the paper's effect, or reversed); "
    "not_worse and near_best (E: the loss the claim tolerates): hold when the interval lies above -E, do not "
    "hold when it lies below -E; otherwise inconclusive, sized by the seeds that detect E with "
    f"{POWER:.0%} power at the measured spread. The spread is at least the measure's step / sqrt(12) (its "
    "rounding), and a measure whose step is coarser than E cannot decide; one seed is one replicate (AR-MAP's "
    f"DLMs, domains and benchmarks of a seed averaged); with fewer than {MIN_SEEDS} seeds inconclusive, saying "
    f"whether their mean reproduces the paper (at least {REPRODUCED:.0%} of E; not worse: no loss beyond E); every "
    f"compared run's mean below {FLOOR} or above {CEILING} on the claim's metric: uninformative; the AR teacher "
    "itself below the teacher floor (claims.teacher_floor, default 0.3) on it: uninformative"
)


def read_input(path: str):
    """One file the claims read: an evaluation, manifest or gamma curve (JSON), or a spectra table (CSV)."""
    return pd.read_csv(path) if str(path).endswith(".csv") else read_json(path)


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def teacher_floor(resolved: Resolved) -> float:
    """claims.teacher_floor: below it the AR teacher's own score shows nothing (default TEACHER_FLOOR)."""
    return resolved.config.get("claims", {}).get("teacher_floor", TEACHER_FLOOR)


def claim_model(resolved: Resolved, c: Claim) -> str:
    return c.model or resolved.studies[c.study].models[0]


def _teacher_score(resolved: Resolved, model: str, benchmark: str) -> float:
    """The AR teacher's headline score on a benchmark (its one evaluation)."""
    return resolved.benchmarks[benchmark].headline_value(read_input(layout.eval_path(benchmark, model, TEACHER)))


def _informative(resolved: Resolved, c: Claim) -> tuple[list[str], list[str]]:
    """(read, left out) of a claim's benchmarks: a claim on several reads the mean over those the AR
    teacher scores at least claims.teacher_floor on (its headline metric; the paper's average over
    its tasks); a claim on one reads it."""
    if not isinstance(c.benchmark, list):
        return [c.benchmark], []
    floor = teacher_floor(resolved)
    score = {b: _teacher_score(resolved, claim_model(resolved, c), b) for b in c.benchmark}
    return [b for b in c.benchmark if score[b] >= floor], [
        f"{b} ({score[b]:.3f})" for b in c.benchmark if score[b] < floor
    ]


def _label(resolved: Resolved, c: Claim) -> str:
    """What a claim's score is, in its report row."""
    if not isinstance(c.benchmark, list):
        return f"{c.benchmark} {c.metric}"
    read, left = _informative(resolved, c)
    floor = teacher_floor(resolved)
    return f"mean headline score over {', '.join(read) or 'none'}" + (
        f" (left out, the AR teacher below {floor}: {', '.join(left)})" if left else ""
    )


def _value(resolved: Resolved, c: Claim, run: str, seed, step=None, decoding: str | None = None) -> float:
    """A run's score on the claim's benchmark, model and metric at ``step`` (default: its final
    step), or the teacher's; for a benchmark with one row per decoding setting, the best row or the
    mean over the rows at the lowest threshold (``decoding``, default the claim's); for a claim on
    several benchmarks, the mean of their headline metrics over those the teacher can do."""
    if isinstance(c.benchmark, list):
        one = [
            replace(c, benchmark=b, metric=resolved.benchmarks[b].headline_metric) for b in _informative(resolved, c)[0]
        ]
        return sum(_value(resolved, x, run, seed, step, decoding) for x in one) / len(one)
    if c.benchmark == TRAINING:  # the run's training throughput, from its manifest
        manifest = read_input(layout.conversion_manifest(claim_model(resolved, c), run, seed))
        return manifest["tokens"] / manifest["train_seconds"]
    step = None if run == TEACHER else step or resolved.run(run).steps
    res = read_input(layout.eval_path(c.benchmark, claim_model(resolved, c), run, seed, step))
    if not resolved.benchmarks[c.benchmark].kind.rows:
        return res["metrics"][c.metric]
    rows, which = res["rows"], decoding or c.decoding
    if which == "best":
        return max(r[c.metric] for r in rows)
    if any(r["threshold"] is not None for r in rows):  # a DLM's sweep; the AR teacher writes one row
        if which == "lowest_threshold":
            at = min(r["threshold"] for r in rows)
        else:  # default_threshold: where the benchmark's other evaluations decode
            at = resolved.benchmarks[c.benchmark].settings["threshold"]
        rows = [r for r in rows if r["threshold"] == at]
    return sum(r[c.metric] for r in rows) / len(rows)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    mean: float
    sd: float
    ci: tuple[float, float]
    p: float  # two-sided paired t-test of mean difference 0
    # two-sided p of the bound the verdict crossed (Holm's input): 1 when tested and none crossed, nan when not tested
    p_bound: float = float("nan")


def verdict(diffs: list[float], test: str, effect: float, size: bool = False, step: float = 0.0) -> Verdict:
    """The verdict on paired differences a - b under ``test``, against the paper's effect
    ``effect`` >= 0 (for not_worse and near_best: the loss tolerated), for a claim that states that size
    (``size``) or a direction, on a measure of resolution ``step`` (the rule: VERDICT_RULE)."""
    from scipy import special  # the t distribution's quantile and tail: scipy.stats.t's own functions

    if test not in ("greater", "not_worse", "near_best"):
        raise ValueError(f"unknown test {test!r} (known: greater, not_worse, near_best)")
    if not effect >= 0:
        raise ValueError(f"the paper's effect must be >= 0, got {effect!r}")
    n = len(diffs)
    mean = statistics.fmean(diffs) if n else float("nan")
    sd = statistics.stdev(diffs) if n > 1 else float("nan")
    few = f"inconclusive (fewer than {MIN_SEEDS} seeds; {reproduction(mean, n, test, effect)})"
    if n < 2:
        return Verdict(few, mean, sd, (float("nan"), float("nan")), float("nan"))
    # the t interval (scipy.stats.ttest_1samp's) with the spread no smaller than the measure's rounding
    se = max(sd, step / math.sqrt(12)) / math.sqrt(n)

    def p_at(x: float) -> float:  # two-sided p of a true mean difference x
        if se == 0:
            return 1.0 if mean == x else 0.0
        return float(2 * special.stdtr(n - 1, -abs(mean - x) / se))

    half = float(special.stdtrit(n - 1, 0.5 + CONFIDENCE / 2)) * se
    ci, p = (mean - half, mean + half), p_at(0.0)
    if n < MIN_SEEDS:
        return Verdict(few, mean, sd, ci, p)
    if effect > 0 and step > effect:
        more = math.ceil(step / effect)
        why = f"its step {step:.3g} is coarser than the paper's effect {effect:.4g}: {more}x its items would resolve it"
        return Verdict(f"cannot decide ({why})", mean, sd, ci, p)
    bound = 1.0  # tested, no bound crossed
    if test == "greater":
        size_bound = effect if size else 0.0
        if ci[0] > size_bound:
            smaller = f" (an effect smaller than the paper's: the interval lies below +{effect:.4g})"
            v, bound = "holds" + (smaller if ci[1] < effect else ""), p_at(size_bound)
        elif ci[0] > 0 and ci[1] < effect:  # a size claim: the direction holds, the size does not
            v = f"smaller than the paper's (the interval lies above 0 and below +{effect:.4g})"
            bound = max(p, p_at(effect))
        elif ci[1] < effect and ci[0] <= 0:
            why = "reversed: the interval lies below 0" if ci[1] < 0 else f"the interval lies below +{effect:.4g}"
            v, bound = f"does not hold (the paper's effect excluded, {why})", p_at(effect)
        elif ci[0] > 0:
            v = f"inconclusive (above 0; the paper's +{effect:.4g} neither cleared nor excluded)"
        else:
            v = "inconclusive"
    elif ci[0] >= -effect:
        v, bound = "holds", p_at(-effect)
    elif ci[1] < -effect:
        v = f"does not hold (a loss beyond the tolerated {effect:.4g}: the interval lies below -{effect:.4g})"
        bound = p_at(-effect)
    else:
        v = "inconclusive"
    return Verdict(v, mean, sd, ci, p, bound)


def holm(bounds: list[float]) -> list[float]:
    """Holm's step-down adjustment of the verdicts' p-values over one preset's claims; the family is the
    claims tested (nan: not tested, left out)."""
    tested = sorted((p, i) for i, p in enumerate(bounds) if not math.isnan(p))
    adjusted, running = [float("nan")] * len(bounds), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def reproduction(mean: float, n: int, test: str, effect: float) -> str:
    """What fewer than MIN_SEEDS seeds can say (the paper preset runs one): whether their mean effect
    reproduces the paper's, for a greater claim at least REPRODUCED of E, for a not-worse claim no
    loss beyond the E it tolerates. Not a verdict: no interval on so few seeds."""
    if test == "greater":
        ok = mean >= REPRODUCED * effect
        bound = f"{'at least' if ok else 'below'} {REPRODUCED:.0%} of the paper's +{effect:.4g}"
    else:
        ok = mean >= -effect
        bound = f"{'within' if ok else 'beyond'} the tolerated loss {effect:.4g}"
    if n == 1:
        return f"the one seed {'reproduces' if ok else 'does not reproduce'} the paper: {mean:+.4f}, {bound}"
    return f"the {n} seeds' mean {'reproduces' if ok else 'does not reproduce'} the paper: {mean:+.4f}, {bound}"


MAX_SEEDS = 1000  # beyond this the effect is too small against its spread to size


def seeds_for_power(effect: float, sd: float, power: float = POWER) -> int | None:
    """The fewest seeds n (>= MIN_SEEDS) at which the paired t-test of the verdicts (two-sided, at
    the interval's confidence) detects a true mean difference ``effect`` with per-seed spread ``sd``
    with probability ``power``: P(t > t(0.975, n - 1)) under the noncentral t with n - 1 degrees of
    freedom and noncentrality effect * sqrt(n) / sd. The same n excludes ``effect`` with that
    probability when the true difference is 0. None when no number up to MAX_SEEDS would; MIN_SEEDS
    when there is no spread."""
    from scipy import stats  # here, not at the top: the DAG build imports this module for claim_inputs

    if math.isnan(effect) or math.isnan(sd) or effect <= 0:
        return None
    if sd == 0:
        return MIN_SEEDS

    def ok(n: int) -> bool:
        crit = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)
        return stats.nct.sf(crit, n - 1, effect * math.sqrt(n) / sd) >= power

    if not ok(MAX_SEEDS):
        return None
    lo, hi = MIN_SEEDS, MAX_SEEDS  # power rises with n: bisect for the first n that reaches it
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def judge(
    diffs: list[float],
    test: str,
    effect: float,
    arms: dict[str, float] | None = None,
    size: bool = False,
    step: float = 0.0,
) -> Verdict:
    """``verdict``, unless the runs compared (``arms``: each run's mean on the claim's metric, a
    score in [0, 1]) all sit at the floor or all at the ceiling: then the comparison is uninformative."""
    v = verdict(diffs, test, effect, size, step)
    if (
        arms
        and len(diffs) >= MIN_SEEDS
        and (all(m < FLOOR for m in arms.values()) or all(m > CEILING for m in arms.values()))
    ):
        where = "floor" if all(m < FLOOR for m in arms.values()) else "ceiling"
        means = ", ".join(f"{r} {m:.3f}" for r, m in arms.items())
        return Verdict(f"uninformative (every run at the {where}: {means})", v.mean, v.sd, v.ci, v.p)  # no bound
    return v


def _paired_seeds(study: Study, runs: list[str]) -> list[int]:
    """The seeds every one of the compared runs has in the study (differences are paired by seed)."""
    return sorted(set.intersection(*(set(study.seeds(r)) for r in runs)))


def claim_inputs(resolved: Resolved) -> list[str]:
    """The evaluation and AR-MAP files the claims read: every run of each claim's study on the
    claim's benchmark and model at its final step (at every evaluated step where the study
    evaluates all checkpoints; with the runs' manifests for an equal-FLOPs claim), the teacher,
    the gamma curves of the merge each AR-MAP claim reads, and for merged-vs-direct the
    evaluations of the merged and the directly DPO'd DLMs."""
    paths = []
    a = resolved.config.get("armap", {})
    for c in resolved.claims:
        if c.armap and c.armap["measure"] == "merged_vs_direct":
            paths += [
                layout.derived_eval_path(b, *d, name)
                for d, pdomain, b in _armap_evals(resolved)
                for name in (layout.armap_name(pdomain, c.armap["merge"]), layout.direct_name(pdomain, _baseline(c)))
            ]
            paths += [layout.eval_path(b, d.model, TEACHER) for d, _, b in _armap_evals(resolved)]  # its floor
            continue
        if c.armap and c.armap["measure"] == "shadowing":
            paths += [layout.spectra_csv(*d, pdomain) for d in resolved.armap.dlms for pdomain in a["domains"]]
            continue
        if c.armap:
            paths += [
                layout.gamma_curve(*d, pdomain, c.armap["merge"])
                for d in resolved.armap.dlms
                for pdomain in a["domains"]
            ]
            continue
        model = claim_model(resolved, c)
        training = c.benchmark == TRAINING
        benchmarks = [] if training else c.benchmark if isinstance(c.benchmark, list) else [c.benchmark]
        paths += [layout.eval_path(b, model, TEACHER) for b in benchmarks]
        for m in resolved.studies[c.study].members:
            if m.model == model:
                paths += [layout.eval_path(b, model, m.run, s, k) for b in benchmarks for s in m.seeds for k in m.steps]
                if c.equal_flops or training:
                    paths += [layout.conversion_manifest(model, m.run, s) for s in m.seeds]
    return sorted(set(paths))


ARMAP_MEASURES = {
    "above_one": "test reward accuracy at the best gamma above 1 minus at the best gamma at or below 1 (each "
    "chosen on the search pairs)",
    "vs_gamma_one": "test reward accuracy at gamma_hat minus at gamma 1",
    "vs_no_transfer": "test reward accuracy at gamma_hat minus at gamma 0 (the DLM without the preference vector)",
    "merged_vs_direct": "the merged DLM (gamma_hat) minus the same DLM trained directly, on each domain's benchmarks",
    "gamma_order": "gamma_hat of the higher domain minus that of the lower domain",
    "shadowing": "log10 of the median over weight matrices of spectral_norm(tau_diffusion) / spectral_norm(tau_pref)",
}


@dataclass(frozen=True)
class Measured:
    """A claim's per-seed differences, what they measure, each compared arm's mean (None where the claim
    reads no scores), and the measure's step (one per-seed difference moves by at least this much; 0 for
    a continuous measure)."""

    diffs: list[float]
    measure: str
    arms: dict[str, float] | None
    step: float = 0.0


def per_seed(cells: list[tuple[int, float]]) -> tuple[list[float], int]:
    """One difference per seed, the mean of its cells (the DLMs, domains and benchmarks of one seed share
    its conversion and DPO runs: they are not independent replicates), and the cells per seed."""
    seeds = sorted({seed for seed, _ in cells})
    return [_mean([x for seed, x in cells if seed == s]) for s in seeds], len(cells) // max(len(seeds), 1)


def _score_step(result: dict) -> float:
    """The step of a score over an evaluation's tasks (1 / tasks x samples; 0 when it does not say)."""
    n = result.get("n_tasks", 0) * result.get("samples_per_task", 1)
    return 1.0 / n if n else 0.0


def _baseline(c: Claim) -> str:
    """The direct baseline a merged-vs-direct claim compares with (armap.dlm_<objective>)."""
    return c.armap.get("baseline", "dpo")


def _armap_evals(resolved: Resolved) -> list[tuple[tuple, str, str]]:
    """The (DLM, domain, benchmark) cells a merged-vs-direct claim pairs: the DLMs DPO'd directly
    (armap.dlm_dpo_seeds) on each searched domain's benchmarks."""
    a = resolved.config["armap"]
    seeds = dlm_dpo_seeds(a)
    return [
        (d, pdomain, b)
        for d in resolved.armap.dlms
        if d.seed in seeds
        for pdomain in a["domains"]
        for b in a["evals"].get(pdomain, [])
    ]


def _armap_differences(resolved: Resolved, c: Claim) -> Measured:
    """AR-MAP's per-seed differences (ARMAP_MEASURES), and for merged-vs-direct the two arms' means."""
    measure, merge = c.armap["measure"], c.armap.get("merge")
    domains = resolved.config["armap"]["domains"]
    # per DLM and domain: how many orders of magnitude tau_diffusion's norms lie above (a conversion that moved
    # nothing: a median of 0, read as 1e-12)
    if measure == "shadowing":
        cells = [
            (d.seed, math.log10(max(_finite(read_input(layout.spectra_csv(*d, p))["shadowing_ratio"]).median(), 1e-12)))
            for d in resolved.armap.dlms
            for p in domains
        ]
        return Measured(per_seed(cells)[0], ARMAP_MEASURES[measure], None)
    if measure == "merged_vs_direct":
        return _merged_vs_direct(resolved, c)
    cells, step = [], 0.0
    if measure == "gamma_order":  # gamma_hat moves by the grid's finest spacing at least
        grid = sorted(float(g) for g in resolved.config["armap"]["gamma"]["grid"])
        step = min(b - a for a, b in zip(grid, grid[1:]))
    for d in resolved.armap.dlms:
        curves = {
            pdomain: read_input(layout.gamma_curve(*d, pdomain, merge))
            for pdomain in domains
            if measure != "gamma_order" or pdomain in (c.armap["lower"], c.armap["higher"])
        }
        if measure == "gamma_order":
            cells.append((d.seed, curves[c.armap["higher"]]["gamma_hat"] - curves[c.armap["lower"]]["gamma_hat"]))
            continue
        for g in curves.values():
            test = {float(p["gamma"]): p["test_reward_accuracy"] for p in g["curve"]}
            step = max(step, 1.0 / max(g["test_pairs"], 1))
            if measure == "above_one":
                above = best_point([p for p in g["curve"] if p["gamma"] > 1])
                below = best_point([p for p in g["curve"] if p["gamma"] <= 1])
                cells.append((d.seed, above["test_reward_accuracy"] - below["test_reward_accuracy"]))
            else:  # vs_gamma_one, vs_no_transfer: against the curve's point at gamma 1 or 0
                reference = 1.0 if measure == "vs_gamma_one" else 0.0
                cells.append((d.seed, test[float(g["gamma_hat"])] - test[reference]))
    diffs, k = per_seed(cells)
    text = ARMAP_MEASURES[measure]
    if measure == "gamma_order":
        text = f"gamma_hat of {c.armap['higher']} minus gamma_hat of {c.armap['lower']}"
    return Measured(diffs, f"{text} ({merge})", None, step / max(k, 1))


def _merged_vs_direct(resolved: Resolved, c: Claim) -> Measured:
    """The merged DLM's headline score minus the directly trained DLM's, per seed over its DLMs, domains
    and benchmarks the AR teacher can do."""
    merge = c.armap["merge"]
    floor = teacher_floor(resolved)
    teacher = {(d.model, b): _teacher_score(resolved, d.model, b) for d, _, b in _armap_evals(resolved)}
    cells = [(d, pdomain, b) for d, pdomain, b in _armap_evals(resolved) if teacher[d.model, b] >= floor]
    below = sorted({f"{b} ({score:.3f})" for (_, b), score in teacher.items() if score < floor})
    merged, direct, steps = [], [], []
    for d, pdomain, b in cells:
        headline = resolved.benchmarks[b].headline_value
        arm = read_input(layout.derived_eval_path(b, *d, layout.armap_name(pdomain, merge)))
        merged.append(headline(arm))
        direct.append(headline(read_input(layout.derived_eval_path(b, *d, layout.direct_name(pdomain, _baseline(c))))))
        steps.append(_score_step(arm) if _bounded_benchmark(resolved, b) else 0.0)
    arms = {f"AR-MAP ({merge})": _mean(merged), DIRECT_LABELS[_baseline(c)]: _mean(direct)}
    read = ", ".join(sorted({f"{pdomain}: {b}" for _, pdomain, b in cells}))
    if below:  # a benchmark the AR teacher cannot do shows nothing of what the transfer keeps
        read += f"; left out, the AR teacher below {floor}: {', '.join(below)}"
    label = f"{ARMAP_MEASURES['merged_vs_direct']} ({DIRECT_LABELS[_baseline(c)]}; {read})"
    diffs, k = per_seed([(d.seed, x - y) for (d, _, _), x, y in zip(cells, merged, direct)])
    return Measured(diffs, label, arms, max(steps, default=0.0) / max(k, 1))


def _finite(ratios: pd.Series) -> pd.Series:
    """The ratios of the matrices the preference vector moves (LoRA leaves the others at 0: ratio inf)."""
    return ratios[ratios.map(math.isfinite)]


def _bounded_benchmark(resolved: Resolved, benchmark: str) -> bool:
    """The benchmark's metrics are scores in [0, 1] (floors and ceilings apply; not training's)."""
    return benchmark != TRAINING and resolved.benchmarks[benchmark].kind.scored


def _bounded(resolved: Resolved, c: Claim) -> bool:
    """The claim compares scores in [0, 1]: floors, ceilings and the teacher floor apply."""
    if c.armap:
        return c.armap["measure"] == "merged_vs_direct" and all(
            _bounded_benchmark(resolved, b) for _, _, b in _armap_evals(resolved)
        )
    benches = c.benchmark if isinstance(c.benchmark, list) else [c.benchmark]
    return all(
        _bounded_benchmark(resolved, b) and c.metric not in resolved.benchmarks[b].kind.unbounded for b in benches
    )


def _study_differences(resolved: Resolved, c: Claim) -> Measured:
    """Per-seed differences, what they measure, each compared run's mean, and the scores' step."""
    a, b = c.run, c.against
    study = resolved.studies[c.study]
    if b == BEST_OTHER:  # against the best other run of the study (by its mean over the paired seeds)
        seeds = _paired_seeds(study, study.runs)
        means = {r: [_value(resolved, c, r, s) for s in seeds] for r in study.runs}
        best = max((r for r in study.runs if r != a), key=lambda r: sum(means[r]))
        return Measured(
            [x - y for x, y in zip(means[a], means[best])],
            f"{_label(resolved, c)}: {a} minus the best other run ({best})",
            {r: _mean(v) for r, v in means.items()},
            _claim_step(resolved, c, a, seeds[0]) if seeds else 0.0,
        )
    seeds = _paired_seeds(study, [a] + ([] if b == TEACHER else [b]))
    va = [_value(resolved, c, a, s) for s in seeds]
    vb = [_value(resolved, c, b, None if b == TEACHER else s) for s in seeds]
    measure = (
        _label(resolved, c)
        + {
            "best": "",
            "lowest_threshold": " at the lowest threshold",
            "default_threshold": " at the default threshold",
        }[c.decoding]
        + f": {a} minus {b}"
    )
    step = _claim_step(resolved, c, a, seeds[0]) if seeds else 0.0
    return Measured([x - y for x, y in zip(va, vb)], measure, {a: _mean(va), b: _mean(vb)}, step)


def _claim_step(resolved: Resolved, c: Claim, run: str, seed: int) -> float:
    """The step of the claim's per-seed score of ``run`` (over several benchmarks: the coarsest one's over
    their number); 0 for a continuous measure (throughput, training, an unbounded metric)."""
    if not _bounded(resolved, c):
        return 0.0
    benches = _informative(resolved, c)[0] if isinstance(c.benchmark, list) else [c.benchmark]
    model, step = claim_model(resolved, c), resolved.run(run).steps
    steps = [_score_step(read_input(layout.eval_path(b, model, run, seed, step))) for b in benches]
    return max(steps, default=0.0) / max(len(steps), 1)


def effect_by_step(resolved: Resolved, c: Claim) -> dict[int, list[float]]:
    """The claim's per-seed differences (run - against, paired seeds) at every training step both
    runs were evaluated at: the study evaluates all checkpoints (``checkpoints: all``) and the runs
    share a step budget. Empty otherwise."""
    a, b = c.run, c.against
    study = resolved.studies[c.study]
    if study.spec.get("checkpoints") != "all" or b in (TEACHER, BEST_OTHER):
        return {}
    model = claim_model(resolved, c)
    steps = {m.run: m.steps for m in study.members if m.model == model}
    seeds = _paired_seeds(study, [a, b])
    return {
        k: [_value(resolved, c, a, s, k) - _value(resolved, c, b, s, k) for s in seeds]
        for k in sorted(set(steps[a]) & set(steps[b]))
    }


def teacher_below_floor(resolved: Resolved, c: Claim) -> str | None:
    """Why a claim's benchmark cannot decide it: the AR teacher's own score there is below
    ``claims.teacher_floor`` (default TEACHER_FLOOR; None when it is not)."""
    floor = teacher_floor(resolved)
    if isinstance(c.benchmark, list):  # it reads only those the teacher can do (judge_claim: none of them)
        return None
    score = _value(resolved, c, TEACHER, None, decoding="best")  # its one decoding setting
    if score < floor:
        return (
            f"uninformative (the AR teacher itself scores {score:.3f} on {c.benchmark}, below {floor}: "
            "choose a benchmark it can do)"
        )
    return None


FLOPS_TOLERANCE = 1.15  # an equal-FLOPs claim's runs may differ this much in training FLOPs (rollouts vary)


def unequal_flops(resolved: Resolved, c: Claim, runs: list[str]) -> str | None:
    """Why the runs of an equal-FLOPs comparison are not at equal compute (their recipes' training
    FLOPs, stages before them included, differ by more than FLOPS_TOLERANCE), or None."""
    from .tables import recipe_flops

    model = claim_model(resolved, c)
    seeds = _paired_seeds(resolved.studies[c.study], runs)
    flops = {
        r: sum(recipe_flops(read_input(layout.conversion_manifest(model, r, s))) for s in seeds) / len(seeds)
        for r in runs
    }
    if max(flops.values()) > FLOPS_TOLERANCE * min(flops.values()):
        return "not at equal FLOPs (" + ", ".join(f"{r} {f:.3g}" for r, f in flops.items()) + ")"
    return None


def paper_effect(c: Claim, diffs: list[float], arms: dict[str, float] | None) -> float:
    """The claim's paper effect E in its measure: ``effect.value`` (unit ``abs``), or that percentage
    of the compared arm's mean (unit ``rel``: the mean of the run's arm minus the mean difference)."""
    value, unit = c.effect["value"], c.effect.get("unit", "abs")
    if unit == "abs":
        return value
    if not arms or not diffs:
        raise ValueError(f"claim {c.id}: a relative effect needs the compared arms' scores")
    run_mean = arms.get(c.run, next(iter(arms.values())))  # the run's arm (AR-MAP's merged DLM: the first)
    return value / 100 * max(run_mean - sum(diffs) / len(diffs), 0.0)


def _effect_source(c: Claim) -> str:
    e = c.effect
    amount = f"{e['value']:g}% of the compared arm's mean" if e.get("unit") == "rel" else f"{e['value']:g}"
    reading = "a size the sentence states" if e.get("size") else "the sentence states a direction"
    return f"{amount}, {reading} ({e['where']})"


def _sizing(v: Verdict, effect: float, seeds: int, step: float) -> str | None:
    """For an inconclusive verdict, the seeds that detect the paper's effect with POWER at the measured
    spread (at least the measure's rounding), and the spread and seeds that figure rests on."""
    if not v.verdict.startswith("inconclusive"):
        return None
    if math.isnan(v.sd):
        return "unsized (one seed measures no spread)"
    if effect == 0:
        return "unsized (the paper's effect is 0 here)"
    sd = max(v.sd, step / math.sqrt(12))
    n = seeds_for_power(effect, sd)
    basis = f"(sd {sd:.3g} from {seeds} seeds)"
    return f"> {MAX_SEEDS} (the paper's effect lost in this spread) {basis}" if n is None else f"{n} {basis}"


def judge_claim(resolved: Resolved, c: Claim) -> tuple[dict, dict[int, list[float]]]:
    """One claim's row of the report, and its per-seed effects by training step (empty unless its
    study evaluates every checkpoint)."""
    arms, curve = None, {}  # AR-MAP's claims read gamma and reward accuracy differences, not run scores
    why = None  # why nothing is compared
    step = 0.0
    if c.armap:
        m = _armap_differences(resolved, c)
        diffs, measure, arms, step = m.diffs, m.measure, m.arms, m.step
    elif isinstance(c.benchmark, list) and not _informative(resolved, c)[0]:
        diffs, measure = [], _label(resolved, c)
        floor, left = teacher_floor(resolved), _informative(resolved, c)[1]
        why = f"uninformative (the AR teacher itself scores below {floor} on every benchmark: {', '.join(left)})"
    else:
        m = _study_differences(resolved, c)
        diffs, measure, arms, step = m.diffs, m.measure, m.arms, m.step
        curve = effect_by_step(resolved, c)
    if not diffs:  # a list the teacher can do none of, or AR-MAP's cells all on such benchmarks
        missing = float("nan")
        effect, bounded = missing, False
        why = why or f"uninformative (nothing to compare: {measure})"
        v = Verdict(why, missing, missing, (missing, missing), missing)
    else:
        effect = paper_effect(c, diffs, arms)
        bounded = _bounded(resolved, c)
        v = judge(diffs, c.direction, effect, arms if bounded else None, c.effect.get("size", False), step)
    # no verdict where the comparison cannot decide it; the most basic reason is the one given
    compared = list(resolved.studies[c.study].runs) if c.against == BEST_OTHER else [c.run, c.against]
    if c.equal_flops and (why := unequal_flops(resolved, c, compared)):
        v = Verdict(why, v.mean, v.sd, v.ci, v.p)
    if not c.armap and bounded and c.against != TEACHER and (low := teacher_below_floor(resolved, c)):
        v = Verdict(low, v.mean, v.sd, v.ci, v.p)

    def nan(x):
        return None if math.isnan(x) else round(x, 4)

    by_step = {k: sum(d) / len(d) for k, d in curve.items()}
    row = {
        "id": c.id,
        "paper": c.paper,
        "claim": c.text,
        "study": c.study or "armap",
        "measure": measure,
        "test": c.direction,
        "seeds": len(diffs),
        "effect": round(v.mean, 4),
        "spread (sd)": nan(v.sd),
        f"{CONFIDENCE:.0%} CI": None if math.isnan(v.ci[0]) else f"[{v.ci[0]:+.4f}, {v.ci[1]:+.4f}]",
        "p (paired t)": nan(v.p),
        "differences": ", ".join(f"{d:+.3f}" for d in diffs),
        "verdict": v.verdict,
        "paper effect": round(effect, 4),
        "reads": "size" if c.effect.get("size") else "direction",
        "step": nan(step),
        f"seeds for {POWER:.0%} power": _sizing(v, effect, len(diffs), step),
        "effect by training step": ", ".join(f"{k}: {d:+.3f}" for k, d in by_step.items()) or None,
        "pass@1 beside": _pass1_beside(resolved, c),
        "quote": c.quote,
        "effect from": _effect_source(c),
        "p_bound": v.p_bound,
    }
    return row, curve


def _pass1_beside(resolved: Resolved, c: Claim) -> str | None:
    """For a claim read on pass@k (k > 1), the same comparison on pass@1 from the same samples: its
    mean difference and each arm's mean (None for any other metric)."""
    if c.armap or "_pass@" not in c.metric or c.metric.endswith("@1"):
        return None
    pass1 = replace(c, metric=c.metric.rsplit("@", 1)[0] + "@1")
    m = _study_differences(resolved, pass1)
    diffs, arms = m.diffs, m.arms
    means = ", ".join(f"{r} {m:.3f}" for r, m in (arms or {}).items())
    return f"{pass1.metric} {sum(diffs) / len(diffs):+.4f}" + (f" ({means})" if means else "")


def evaluate_claims(resolved: Resolved) -> tuple[pd.DataFrame, dict[str, dict[int, list[float]]]]:
    """The claims table (one row per claim of ``claims.judged``), and the per-seed effects by
    training step of the claims whose study evaluates every checkpoint (by claim id: the by-step
    figure)."""
    rows, curves = [], {}
    for c in resolved.claims:
        row, curve = judge_claim(resolved, c)
        rows.append(row)
        if curve:
            curves[c.id] = curve
    df = pd.DataFrame(rows)
    if not df.empty:
        df.insert(df.columns.get_loc("verdict") + 1, "after Holm", holm_verdicts(df))
        df = df.drop(columns="p_bound")
    return df, curves


def holm_verdicts(df: pd.DataFrame) -> list[str]:
    """Each row's verdict after Holm's correction over the preset's claims: a decided verdict whose
    adjusted p-value reaches 1 - CONFIDENCE becomes inconclusive."""
    alpha = 1 - CONFIDENCE
    out = []
    for (_, row), adjusted in zip(df.iterrows(), holm(list(df["p_bound"]))):
        if math.isnan(adjusted) or row["verdict"].startswith("inconclusive"):
            out.append("-")
        else:
            word = row["verdict"].split(" (")[0]
            out.append(f"{word if adjusted < alpha else 'inconclusive'} (adjusted p {adjusted:.3g})")
    return out


def claims_markdown(df: pd.DataFrame, preset: str) -> str:
    head = [
        f"# Claims of the four papers, tested on the {preset} preset",
        "",
        "Each row compares two runs of one study, paired by seed. Measured here at this preset's scale: a verdict "
        "says what these runs show, not what the papers found.",
        "",
        f"Verdict rule: {VERDICT_RULE}.",
        "",
        f"'paper effect' is E in the claim's measure (where it comes from: below); 'reads' says whether the quoted "
        "sentence states that size or a direction; 'step' is the measure's resolution. An inconclusive row's 'seeds "
        f"for {POWER:.0%} power' is the fewest seeds at which the paired t-test detects E with that power at the "
        "measured per-seed spread (named beside it, with the seeds it was measured on). 'after Holm' is each decided "
        "verdict after Holm's correction over this preset's claims tested. Where a study evaluates every "
        "checkpoint, 'effect by training step' gives the mean difference at each step; the verdict is read at the "
        "largest budget, the final step.",
        "",
    ]
    quotes = ["", "## The sentences tested, and the paper's effect", ""] + [
        f"- **{r['id']}** ({r['paper']}): "
        + (f"“{r['quote']}”" if isinstance(r["quote"], str) else "beyond the papers (no sentence)")
        + f" Paper effect: {r['effect from']}."
        for _, r in df.iterrows()
    ]
    table = df.drop(columns=["quote", "effect from"]).to_markdown(index=False)
    return "\n".join(head + [table] + quotes + [""])
