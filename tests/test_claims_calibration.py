"""Every configured claim's own measure, fed inputs with no effect, says "holds" (or "smaller than the
paper's", which also asserts an effect) at most 5% of the time; a not-worse claim under a true loss of
twice its tolerance says "holds" at most 5% of the time.

The inputs have the shapes the preset gives them (seeds, tasks, samples, thresholds, gamma grid, held-out
pairs) and are read through the judge itself (``ar2dlm.reporting.claims.judge_claim``), so the test covers
how each measure is built: the arms it pairs, the gamma search's choice on its search pairs, ties, the
unit of replication."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ar2dlm.pipeline import layout
from ar2dlm.pipeline.resolved import resolve
from tests.conftest import REPO

PRESETS = ("smoke", "tiny", "tiny_full", "paper", "paper_standin")
REPLICATES = 200
FEW = 20  # a claim its preset judges on fewer seeds than a verdict needs (one seed: smoke, paper)
FALSE_CLAIMS = 0.05  # the share of null replicates a claim's verdict may assert an effect on
P = 0.5  # every arm's expected score; the AR teacher, one fixed model, scores exactly this
# how the reward margins of a merge without preference change with gamma, the two extremes: a fresh draw per
# gamma (noise dominates), or proportional to gamma (the vector's first-order effect only)
MARGINS = ("independent", "linear")


class Scores(dict):
    """An evaluation's metrics (or one decoding row of them): any metric the judge asks for, drawn once."""

    def __init__(self, draw, **fixed):
        super().__init__(**fixed)
        self._draw = draw

    def __missing__(self, metric):
        self[metric] = value = self._draw()
        return value


class NullWorld:
    """Every file a claim reads, with no effect: a run's score is Binomial(tasks x samples, P) over them, the
    teacher's P; manifests at one throughput's spread and equal FLOPs; gamma curves scored from reward
    margins that carry no preference (``margins``); spectral ratios around 1. ``loser``, ``loss``: a run whose
    scores are ``loss`` lower (a not-worse claim's run under a true loss)."""

    def __init__(self, resolved, rng: np.random.Generator, margins: str, loser: str | None = None, loss: float = 0.0):
        self.resolved, self.rng, self.margins = resolved, rng, margins
        self.loser, self.loss = loser, loss
        self.files: dict[str, object] = {}

    def __call__(self, path: str):
        if path not in self.files:
            self.files[path] = self._draw(Path(path).relative_to(layout.RESULTS).parts)
        return self.files[path]

    def _draw(self, parts: tuple[str, ...]):
        if parts[0] == "eval":
            return self._evaluation(parts[1], run=None if parts[-1] == "teacher.json" else parts[3])
        if parts[0] == "models":  # a conversion's manifest
            return {"tokens": 1e6, "train_seconds": 100.0 * self.rng.lognormal(0.0, 0.1), "flops": {"total": 1e15}}
        if parts[-1] == "spectra.csv":
            return pd.DataFrame({"shadowing_ratio": 10 ** self.rng.normal(0.0, 0.3, size=28)})
        return self._gamma_curve()

    def _evaluation(self, benchmark: str, run: str | None) -> dict:
        settings = _settings(self.resolved, benchmark)
        n = (settings.get("limit") or 200) * settings.get("n_samples", 1)
        p = P - (self.loss if run == self.loser else 0.0)

        def draw():
            return P if run is None else self.rng.binomial(n, p) / n

        result = {"n_tasks": n, "samples_per_task": 1, "metrics": Scores(draw)}
        if self.resolved.benchmarks[benchmark].kind.rows:
            default = settings.get("threshold")
            thresholds = sorted({*settings.get("thresholds", []), *([default] if default is not None else [])})
            result["rows"] = [Scores(draw, threshold=t) for t in ([None] if run is None else thresholds or [None])]
        return result

    def _gamma_curve(self) -> dict:
        import torch

        from ar2dlm.armap.choice import best_point
        from ar2dlm.armap.dpo import preference_accuracies

        a, prefs = self.resolved.config["armap"], self.resolved.config["data"]["preferences"]
        held_out = min(prefs["domains"][d].get("n_eval", prefs["n_eval"]) for d in a["domains"])
        pairs = a["gamma"]["eval_pairs"] or held_out
        grid = np.array(a["gamma"]["grid"], dtype=float)[:, None]
        acc = {}
        for half, n in (("search", (pairs + 1) // 2), ("test", pairs // 2)):
            if self.margins == "independent":
                margins = grid * self.rng.normal(size=(len(grid), n))
            else:
                margins = grid * self.rng.normal(size=n)
            acc[half] = preference_accuracies(torch.from_numpy(margins)).tolist()  # one per gamma
        points = [
            {"gamma": g, "reward_accuracy": s, "test_reward_accuracy": t}
            for g, s, t in zip(a["gamma"]["grid"], acc["search"], acc["test"])
        ]
        return {"curve": points, "gamma_hat": best_point(points)["gamma"], "test_pairs": pairs // 2}


_SETTINGS: dict[tuple[int, str], dict] = {}


def _settings(resolved, benchmark: str) -> dict:
    """A benchmark's settings (``Resolved`` copies them on each read), once per resolved config."""
    key = (id(resolved), benchmark)
    if key not in _SETTINGS:
        _SETTINGS[key] = resolved.benchmarks[benchmark].settings
    return _SETTINGS[key]


@functools.cache
def _claims(preset: str):
    from ar2dlm.pipeline.config import merge_preset

    resolved = resolve(merge_preset({"preset": preset}, REPO / "config"))
    return resolved, resolved.claims


def _asserted(verdict: str) -> bool:
    """The verdict asserts an effect of the claim's sign."""
    return verdict.startswith(("holds", "smaller than the paper's"))


def _rate(monkeypatch, resolved, claim, margins: str, loss: float = 0.0) -> float:
    """The share of replicates whose verdict asserts the claim's effect: REPLICATES of them, or, where the
    preset's shapes give fewer seeds than a verdict needs, FEW (each must assert nothing)."""
    from ar2dlm.reporting import claims as judge

    rng = np.random.default_rng(0)
    hits = done = 0
    replicates = REPLICATES
    while done < replicates:
        world = NullWorld(resolved, rng, margins, loser=claim.run, loss=loss)
        monkeypatch.setattr(judge, "read_input", world)
        row = judge.judge_claim(resolved, claim)[0]
        if row["seeds"] < judge.MIN_SEEDS:
            replicates = FEW
        hits, done = hits + _asserted(row["verdict"]), done + 1
    return hits / done


def _cases():
    for preset in PRESETS:
        resolved, claims = _claims(preset)
        for c in claims:
            yield pytest.param(preset, c.id, id=f"{preset}-{c.id}")


@pytest.mark.parametrize("preset, claim_id", list(_cases()))
def test_a_claims_measure_asserts_no_effect_on_inputs_without_one(monkeypatch, preset, claim_id):
    resolved, claims = _claims(preset)
    (claim,) = [c for c in claims if c.id == claim_id]
    if claim.direction in ("not_worse", "near_best"):  # its effect is the absence of a loss: it fails under one
        assert claim.effect.get("unit", "abs") == "abs", "a not-worse claim tolerates a loss in its own measure"
        rate = _rate(monkeypatch, resolved, claim, MARGINS[0], loss=2 * claim.effect["value"])
        print(f"{preset} {claim_id} losing twice its tolerance: {rate:.3f}")
        assert rate <= FALSE_CLAIMS, f"{claim_id} holds on {rate:.1%} of replicates losing twice its tolerance"
        return
    models = MARGINS if claim.armap and claim.armap["measure"] not in ("shadowing", "merged_vs_direct") else MARGINS[:1]
    for margins in models:
        rate = _rate(monkeypatch, resolved, claim, margins)
        print(f"{preset} {claim_id} {margins}: {rate:.3f}")
        assert rate <= FALSE_CLAIMS, f"{claim_id} asserts its effect on {rate:.1%} of null replicates ({margins})"
