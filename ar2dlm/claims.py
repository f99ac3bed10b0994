"""The papers' directional claims, tested on this preset's results.

Each claim compares run ``a`` with run ``b`` (or the AR teacher) of one study on the study's first
benchmark and first model, paired by seed: effect = mean over seeds of (a - b), spread = standard deviation of the
paired differences, se = spread / sqrt(seeds). ``greater``: holds when effect > 2 se and > 0, does
not hold when effect < -2 se or (with no spread) effect <= 0, else inconclusive. ``not_worse``:
holds when effect >= 0, does not hold when effect + 2 se < 0, else inconclusive. ``near_best``:
a is within 2 se of the best run of the study. Fewer than 3 seeds is always inconclusive.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .provenance import read_json
from .runs import armap_dlms, resolve_run, study_seeds
from .tables import TABLE_METRICS, eval_file

CLAIMS = [
    # (id, paper, claim, study, a, b, test, option)
    ("align_beats_no_align", "REPR-ALIGN", "REPR-ALIGN beats AR-initialised MDLM without alignment at equal steps",
     "repr_align/code", "ra", "mdlm", "greater", None),
    ("cosine_beats_l2", "REPR-ALIGN", "cosine alignment beats L2", "repr_align/metric", "ra", "ra_mse", "greater", None),
    ("lambda10_near_best", "REPR-ALIGN", "lambda = 10 is at or near the best lambda", "ablations/lambda", "ra", None,
     "near_best", None),
    ("freezing_keeps_quality", "REPR-ALIGN", "freezing embeddings and MLPs keeps quality (its training tokens/s: the study table)",
     "repr_align/freezing", "ra_freeze", "ra", "not_worse", None),
    ("subset_align_beats_stream", "REPR-ALIGN", "the small subset with alignment beats the larger stream without",
     "repr_align/data", "ra", "mdlm_stream", "greater", None),
    ("on_policy_beats_off_policy", "OPDLM", "on-policy distillation beats off-policy", "opdlm/policy", "opd", "opd_off",
     "greater", None),
    ("block_beats_bidirectional", "Efficient-DLM", "block attention with clean context beats bidirectional",
     "efficient_dlm/attention", "ed", "ed_bidir", "greater", None),
    ("positional_masking_aggressive", "Efficient-DLM",
     "position-dependent masking beats uniform masking at the most aggressive threshold", "efficient_dlm/masking", "ed",
     "ed_uniform", "greater", "lowest_threshold"),
    ("no_shift_not_worse", "Efficient-DLM", "no shift is at least as good as shift", "efficient_dlm/shift", "ed",
     "ed_shift", "not_worse", None),
    ("dlm_embeddings_beat_ar", "Efficient-DLM", "DLM embeddings beat the AR teacher's embeddings",
     "efficient_dlm/embeddings", None, "teacher", "greater", None),
    ("armap_gamma_above_one", "AR-MAP", "the best gamma is above 1", "armap", None, None, "greater", "gamma_hat"),
    ("armap_beats_plain_transfer", "AR-MAP", "gamma_hat beats plain transfer (gamma = 1) on held-out test pairs",
     "armap", None, None, "greater", "vs_gamma_one"),
]


def _metric(config, benchmark):
    kind = config["eval"]["benchmarks"][benchmark]["kind"]
    return "base_pass@1" if kind == "throughput" else TABLE_METRICS[kind][0]


def _value(config, results, bench, model, run, seed, option):
    step = None if run == "teacher" else resolve_run(config, run)["training"]["steps"]
    res = read_json(eval_file(results, bench, model, run, seed, step))
    if option == "lowest_threshold":
        lowest = min(r["threshold"] for r in res["rows"])
        return sum(r["base_pass@1"] for r in res["rows"] if r["threshold"] == lowest) / \
            sum(1 for r in res["rows"] if r["threshold"] == lowest)
    if config["eval"]["benchmarks"][bench]["kind"] == "throughput":
        return max(r["base_pass@1"] for r in res["rows"])
    return res["metrics"][_metric(config, bench)]


def _verdict(diffs: list[float], test: str) -> tuple[str, float, float]:
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else float("nan")
    if n < 3:
        return "inconclusive (fewer than 3 seeds)", mean, sd
    se = sd / math.sqrt(n)
    if test == "greater":
        if mean > 0 and mean > 2 * se:
            return "holds", mean, sd
        if mean < -2 * se or (se == 0 and mean <= 0):
            return "does not hold", mean, sd
        return "inconclusive", mean, sd
    if test in ("not_worse", "near_best"):
        if mean >= 0:
            return "holds", mean, sd
        return ("does not hold" if mean + 2 * se < 0 else "inconclusive"), mean, sd
    raise ValueError(f"unknown test {test!r}")


def _paired_seeds(config: dict, spec: dict, runs: list[str]) -> list[int]:
    """The seeds every one of the compared runs has in the study (differences are paired by seed)."""
    return sorted(set.intersection(*(set(study_seeds(config, spec, r)) for r in runs)))


def claim_inputs(config: dict, results: str = "results") -> list[str]:
    """The evaluation and AR-MAP files the claims read: every run of each claim's study on the
    study's first benchmark at its final step, the teacher, and the AR-MAP gamma curves."""
    a = config["armap"]
    paths = [str(Path(results) / "armap" / m / r / f"seed{s}" / d / "task_arithmetic" / "gamma.json")
             for m, r, s in armap_dlms(config) for d in a["domains"]]
    for study in {c[3] for c in CLAIMS} - {"armap"}:
        spec = config["studies"].get(study)
        if spec is None:
            continue
        bench = spec["evals"][0]
        model = spec.get("models", resolve_run(config, spec["runs"][0])["models"])[0]
        paths.append(str(eval_file(results, bench, model, "teacher")))
        for r in spec["runs"]:
            step = resolve_run(config, r)["training"]["steps"]
            paths += [str(eval_file(results, bench, model, r, s, step)) for s in study_seeds(config, spec, r)]
    return sorted(set(paths))


def evaluate_claims(config: dict, results: str = "results") -> pd.DataFrame:
    rows = []
    for cid, paper, text, study, a, b, test, option in CLAIMS:
        base = {"id": cid, "paper": paper, "claim": text, "study": study}
        if study == "armap":
            diffs, detail = [], []
            for m, r, s in armap_dlms(config):
                for d in config["armap"]["domains"]:
                    g = read_json(Path(results) / "armap" / m / r / f"seed{s}" / d / "task_arithmetic" / "gamma.json")
                    if option == "gamma_hat":
                        diffs.append(g["gamma_hat"] - 1.0)
                    else:
                        test_curve = {c["gamma"]: c["test_reward_accuracy"] for c in g["curve"]}
                        diffs.append(test_curve[g["gamma_hat"]] - test_curve.get(1, test_curve.get(1.0)))
                    detail.append(f"{d}/seed{s}")
            measure = "gamma_hat - 1" if option == "gamma_hat" else "test reward accuracy at gamma_hat minus at gamma 1"
        else:
            spec = config["studies"].get(study)
            if spec is None:
                rows.append({**base, "verdict": "not run in this preset"})
                continue
            bench = spec["evals"][0]
            model = spec.get("models", resolve_run(config, spec["runs"][0])["models"])[0]
            if test == "near_best":
                seeds = _paired_seeds(config, spec, spec["runs"])
                means = {r: [_value(config, results, bench, model, r, s, option) for s in seeds] for r in spec["runs"]}
                best = max((r for r in spec["runs"] if r != a), key=lambda r: sum(means[r]))
                diffs = [x - y for x, y in zip(means[a], means[best])]
                measure = f"{bench} {_metric(config, bench)}: {a} minus the best other run ({best})"
            else:
                a_run = a or spec["runs"][0]
                seeds = _paired_seeds(config, spec, [a_run] + ([] if b == "teacher" else [b]))
                va = [_value(config, results, bench, model, a_run, s, option) for s in seeds]
                vb = [_value(config, results, bench, model, b, None if b == "teacher" else s, option) for s in seeds]
                diffs = [x - y for x, y in zip(va, vb)]
                measure = f"{bench} {_metric(config, bench)}" + (" at the lowest threshold" if option else "") + \
                    f": {a_run} minus {b}"
        verdict, mean, sd = _verdict(diffs, test)
        rows.append({**base, "measure": measure, "test": test, "seeds": len(diffs), "effect": round(mean, 4),
                     "spread (sd)": None if math.isnan(sd) else round(sd, 4),
                     "differences": ", ".join(f"{d:+.3f}" for d in diffs), "verdict": verdict})
    return pd.DataFrame(rows)


def claims_markdown(df: pd.DataFrame, preset: str) -> str:
    head = [f"# Claims of the four papers, tested on the {preset} preset", "",
            "Each row compares two runs of one study, paired by seed (see ar2dlm/claims.py for the tests). "
            "Measured here at this preset's scale: a verdict says what these runs show, not what the papers found.", ""]
    return "\n".join(head + [df.to_markdown(index=False), ""])
