"""What a claim is: the judged claims of the config (``claims.judged``) as typed :class:`Claim`
objects, the names a claim compares with besides its study's runs, and the checks the DAG build runs
on them. The judge (:mod:`ar2dlm.reporting.claims`) reads these."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..evaluation.suite import BENCHMARK_KINDS
from .config import ConfigError, benchmark_settings
from .jobs import study_models
from .runs import resolve_run

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


def _claims(config: dict) -> dict:
    return config.get("claims", {}).get("judged", {})


def claim_merges(config: dict) -> set[str]:
    """The merges whose gamma searches AR-MAP's claims read."""
    return {c.armap["merge"] for c in declared_claims(config) if c.armap and "merge" in c.armap}


def check_claims(config: dict) -> None:
    """Every claim names what exists: a study, runs of it, a benchmark of it and a metric that
    benchmark writes, or a merge of armap.merges."""
    for c in declared_claims(config):
        key = f"claims.judged.{c.id}"
        if c.armap is not None:
            if extra := [k for k in STUDY_CLAIM_KEYS if k in _claims(config)[c.id]]:
                raise ConfigError(
                    f"{key}.{extra[0]}",
                    "an AR-MAP claim (armap:) reads the gamma searches; "
                    f"{', '.join(STUDY_CLAIM_KEYS)} are a study claim's keys",
                )
            check_armap_claim(config, key, c.armap)
            relative_ok = c.armap["measure"] == "merged_vs_direct"
        else:
            if c.study not in config["studies"]:
                raise ConfigError(f"{key}.study", f"{c.study!r} is not a key of studies")
            check_claim_runs(config, key, c)
            check_claim_metric(config, key, c)
            benches = c.benchmark if isinstance(c.benchmark, list) else [c.benchmark]
            relative_ok = all(
                b == TRAINING or BENCHMARK_KINDS[config["eval"]["benchmarks"][b]["kind"]].scored for b in benches
            )
        if c.effect.get("unit") == "rel" and not relative_ok:
            raise ConfigError(
                f"{key}.effect.unit",
                "rel (percent of the compared arm's mean) needs a study claim on a scored benchmark or on "
                "training, or AR-MAP's merged_vs_direct; give the effect in the claim's measure (abs)",
            )


def check_armap_claim(config: dict, key: str, spec: dict) -> None:
    """An AR-MAP claim's merge is searched (and, compared with direct DLM DPO, evaluated), and the
    domains it orders are searched."""
    a, merge = config["armap"], spec.get("merge")
    if spec["measure"] == "shadowing":  # the task vectors' spectra: before any merge
        if merge is not None:
            raise ConfigError(f"{key}.armap.merge", "shadowing reads the task vectors' spectra, before any merge")
        return
    if merge is None:
        raise ConfigError(f"{key}.armap.merge", f"{spec['measure']} reads a merge's gamma searches: name one")
    if merge not in a["merges"]:
        raise ConfigError(f"{key}.armap.merge", f"{merge!r} is not a key of armap.merges ({', '.join(a['merges'])})")
    reference = {"vs_gamma_one": 1, "vs_no_transfer": 0}.get(spec["measure"])
    if reference is not None and reference not in a["gamma"]["grid"]:
        raise ConfigError("armap.gamma.grid", f"{key} compares with gamma {reference}, which the grid does not search")
    if "baseline" in spec and spec["measure"] != "merged_vs_direct":
        raise ConfigError(
            f"{key}.armap.baseline", f"only merged_vs_direct compares with a baseline, not {spec['measure']}"
        )
    if spec["measure"] == "merged_vs_direct":
        if merge not in a["eval_merges"]:
            raise ConfigError(
                f"{key}.armap.merge",
                f"{merge!r} is not evaluated (armap.eval_merges: {', '.join(a['eval_merges'])}); merged_vs_direct "
                "compares its evaluations with the directly DPO'd DLM's",
            )
        if not a.get("dlm_dpo_seeds", a["seeds"]):
            raise ConfigError("armap.dlm_dpo_seeds", f"empty: {key} compares with the directly DPO'd DLM")
        baseline = spec.get("baseline", "dpo")
        if f"dlm_{baseline}" not in a:
            raise ConfigError(
                f"{key}.armap.baseline", f"{baseline!r} compares with armap.dlm_{baseline}, not configured"
            )
        if not any(a["evals"].get(d) for d in a["domains"]):
            raise ConfigError("armap.evals", f"no searched domain has a benchmark: {key} compares their scores")
    if spec["measure"] == "gamma_order":
        for side in ("lower", "higher"):
            if spec[side] not in a["domains"]:
                raise ConfigError(
                    f"{key}.armap.{side}", f"{spec[side]!r} is not one of armap.domains ({', '.join(a['domains'])})"
                )
        if spec["lower"] == spec["higher"]:
            raise ConfigError(f"{key}.armap.higher", f"orders {spec['lower']!r} against itself")


def check_claim_runs(config: dict, key: str, c: Claim) -> None:
    """The compared runs are the study's (or the teacher, or the best other run), on its model."""
    spec = config["studies"][c.study]
    runs, where = spec["runs"], f"the runs of studies.{c.study} ({', '.join(spec['runs'])})"
    if c.run not in runs:
        raise ConfigError(f"{key}.run", f"{c.run!r} is not one of {where}")
    if c.against not in runs and c.against not in (TEACHER, BEST_OTHER):
        raise ConfigError(f"{key}.against", f"{c.against!r} is neither teacher, best_other nor one of {where}")
    if c.against == BEST_OTHER and BEST_OTHER in runs:
        raise ConfigError(f"{key}.against", f"{BEST_OTHER} is ambiguous: the study has a run of that name")
    if c.against == c.run or (c.against == BEST_OTHER and len(runs) < 2):
        raise ConfigError(f"{key}.against", f"compares {c.run!r} with itself")
    if c.equal_flops and c.against == TEACHER:
        raise ConfigError(f"{key}.equal_flops", "the AR teacher has no training FLOPs to compare")
    models = study_models(config, spec)
    model = c.model or models[0]
    if model not in models:
        raise ConfigError(
            f"{key}.model", f"{model!r} is not one of the models of studies.{c.study} ({', '.join(models)})"
        )
    for r in (c.run, c.against):
        if r in runs and model not in resolve_run(config, r)["models"]:
            raise ConfigError(f"{key}.model", f"run {r!r} does not train on {model!r}")


def check_claim_metric(config: dict, key: str, c: Claim, in_list: bool = False) -> None:
    """The claim's benchmark is one of its study's, and writes the metric it reads."""
    study, name, metric = c.study, c.benchmark, c.metric
    if isinstance(name, list):  # the mean over several benchmarks, each on its headline metric
        if metric != HEADLINE:
            raise ConfigError(f"{key}.metric", f"a claim on several benchmarks reads each one's {HEADLINE!r} metric")
        if c.decoding != "best":
            raise ConfigError(f"{key}.decoding", "a claim on several benchmarks reads each one's headline (best) row")
        for b in name:
            check_claim_metric(config, key, replace(c, benchmark=b), in_list=True)
        return
    if metric == HEADLINE and not in_list:
        raise ConfigError(f"{key}.metric", f"{HEADLINE!r} is the metric of a claim on a list of benchmarks")
    if name == TRAINING:
        if metric not in TRAINING_METRICS:
            known = ", ".join(TRAINING_METRICS)
            raise ConfigError(f"{key}.metric", f"{metric!r} is not a metric of training ({known})")
        if c.against == TEACHER:
            raise ConfigError(f"{key}.against", "the AR teacher has no conversion run to read training from")
        return
    if name not in config["studies"][study]["evals"]:
        raise ConfigError(
            f"{key}.benchmark",
            f"{name!r} is not one of the evals of studies.{study} ({', '.join(config['studies'][study]['evals'])})",
        )
    bench = benchmark_settings(config, name)
    kind = BENCHMARK_KINDS[bench["kind"]]
    if metric == HEADLINE:
        if not kind.scored:
            raise ConfigError(f"{key}.benchmark", f"{name} (kind {bench['kind']}) has no score in [0, 1] to average")
        return
    if metric in kind.rates and c.decoding == "best":
        raise ConfigError(
            f"{key}.decoding",
            f"{metric} of the best row is the fastest setting whatever its accuracy: read lowest_threshold or "
            "default_threshold",
        )
    if metric not in kind.metrics:
        raise ConfigError(
            f"{key}.metric",
            f"{metric!r} is not a metric of benchmark {name} (kind {bench['kind']}: {', '.join(kind.metrics)})",
        )
    k = int(metric.rsplit("@", 1)[1]) if "_pass@" in metric else 1
    if k > bench.get("n_samples", 1):
        raise ConfigError(
            f"{key}.metric",
            f"{metric} needs at least {k} samples per task; "
            f"eval.benchmarks.{name}.n_samples is {bench.get('n_samples', 1)}",
        )
    if metric.startswith("plus_") and bench.get("format") != "evalplus":
        raise ConfigError(
            f"{key}.metric", f"{metric} needs the evalplus format; eval.benchmarks.{name} is {bench.get('format')}"
        )
    if c.decoding != "best" and not kind.rows:
        raise ConfigError(
            f"{key}.decoding",
            f"benchmark {name} (kind {bench['kind']}) writes one result, not one row per decoding setting",
        )
    if c.decoding == "default_threshold" and bench["threshold"] not in bench.get("thresholds", []):
        raise ConfigError(
            f"{key}.decoding",
            f"benchmark {name} sweeps thresholds {bench.get('thresholds')}, not its own {bench['threshold']}",
        )
