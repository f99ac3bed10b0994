"""What a claim is: the judged claims of the config (``claims.judged``) as typed :class:`Claim`
objects and the names a claim compares with besides its study's runs. The DAG build checks them
(:mod:`ar2dlm.pipeline.checks`); the judge (:mod:`ar2dlm.reporting.claims`) reads them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TEACHER, BEST_OTHER = "teacher", "best_other"  # what a claim may compare with besides a run of its study
# a claim's benchmark may also be the runs' training itself (their manifests), on one of these metrics
TRAINING, TRAINING_METRICS = "training", ("tokens_per_s",)
HEADLINE = "headline"  # the metric of a claim on several benchmarks: each one's headline, averaged
STUDY_CLAIM_KEYS = ("study", "run", "against", "model", "benchmark", "metric", "decoding", "equal_flops")


@dataclass(frozen=True)
class Claim:
    """One entry of ``claims.judged`` (the schema describes each key)."""

    id: str
    paper: str
    text: str
    direction: str  # greater, not_worse or near_best
    study: str | None = None  # None: an AR-MAP claim
    run: str | None = None
    against: str | None = None  # a run of the study, TEACHER or BEST_OTHER
    model: str | None = None  # None: the study's first model
    benchmark: str | None = None
    metric: str | None = None
    decoding: str = "best"  # or lowest_threshold, default_threshold (benchmarks with one row per decoding setting)
    equal_flops: bool = False
    effect: dict | None = None  # the paper's effect: {value, unit: abs | rel, where}
    armap: dict | None = None  # {measure, merge[, lower, higher, baseline]}: see ARMAP_MEASURES
    quote: str | None = None  # the sentence of the paper's summary the claim tests (None: beyond the papers)


def declared_claims(config: dict) -> list[Claim]:
    """The claims the preset declares, in its order."""
    return [Claim(id=cid, **spec) for cid, spec in config.get("claims", {}).get("judged", {}).items()]


def claim_merges(claims: Iterable[Claim]) -> set[str]:
    """The merges whose gamma searches AR-MAP's claims read."""
    return {c.armap["merge"] for c in claims if c.armap and "merge" in c.armap}
