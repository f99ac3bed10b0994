"""Job lists: what the preset's grid trains, what its studies evaluate, and AR-MAP's jobs, as named
records that know their output path (``layout``). The Snakefile asks for these outputs; tables,
claims and reports read the same records, so both sides walk one list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..methods.registry import training_data
from . import layout
from .runs import init_chain, resolve_run


class Conversion(NamedTuple):
    """One conversion run of the grid."""

    model: str
    run: str
    seed: int

    @property
    def manifest(self) -> str:
        return layout.conversion_manifest(self.model, self.run, self.seed)


class CheckpointEval(NamedTuple):
    """A conversion checkpoint on one benchmark."""

    benchmark: str
    model: str
    run: str
    seed: int
    step: int

    @property
    def path(self) -> str:
        return layout.eval_path(self.benchmark, self.model, self.run, self.seed, self.step)


class TeacherEval(NamedTuple):
    """An AR teacher on one benchmark."""

    benchmark: str
    model: str

    @property
    def path(self) -> str:
        return layout.eval_path(self.benchmark, self.model, "teacher")


class StudyMember(NamedTuple):
    """One run of a study on one model: the seeds the study asks of it and the steps it evaluates."""

    model: str
    run: str
    seeds: list[int]
    steps: list[int]
    final_step: int


def conversion_settings(config: dict, name: str) -> dict:
    """What a run trains with: its resolved settings without the job selection (models, seeds),
    so adding a model or a seed elsewhere does not retrain existing runs."""
    out = {k: v for k, v in resolve_run(config, name).items() if k not in ("models", "seeds")}
    if isinstance(out["init"], dict):  # a run started from another one changes when that one does
        out["init"] = {"run": out["init"]["run"], "settings": conversion_settings(config, out["init"]["run"])}
    return out


def study_config(config: dict, study: str) -> dict:
    """What a study's table and figure read from the config (so other studies' edits rerun
    nothing): its runs, and the runs staged runs start from."""
    spec = config["studies"][study]
    runs = {r: config["runs"][r] for name in spec["runs"] for r in [name, *init_chain(config, name)]}
    methods = {"methods": config["methods"]} if "methods" in config else {}  # modules registering its methods
    return {
        "preset": config["preset"],
        "seed": config["seed"],
        "studies": {study: spec},
        "runs": runs,
        **methods,
        "training": config["training"],
        "models": config["models"],
        "data": {"prompt_sets": config["data"]["prompt_sets"]},  # which token rows a run reads (conversion_rows)
        "eval": {
            "decoding": config["eval"]["decoding"],
            "benchmarks": {e: config["eval"]["benchmarks"][e] for e in spec["evals"]},
        },
    }


def init_manifest(config: dict, model: str, name: str, seed) -> list[str]:
    """The manifest of the run a run starts from, on the same model and seed ([] when it starts
    from the teacher or from scratch)."""
    init = resolve_run(config, name)["init"]
    return [layout.conversion_manifest(model, init["run"], seed)] if isinstance(init, dict) else []


def checkpoint_steps_of(run: dict) -> list[int]:
    """Steps at which a run writes a checkpoint (every K steps and the last)."""
    t = run["training"]
    return sorted({*range(t["checkpoint_every"], t["steps"] + 1, t["checkpoint_every"]), t["steps"]})


def study_seeds(config: dict, spec: dict, run: str) -> list[int]:
    """Seeds of one run in a study: its entry in the study's run_seeds, else the study's seeds, else the run's."""
    return spec.get("run_seeds", {}).get(run, spec.get("seeds", resolve_run(config, run)["seeds"]))


def study_models(config: dict, spec: dict) -> list[str]:
    """The study's models: as listed, else every model one of its runs trains on (sorted)."""
    return spec.get("models") or sorted({m for r in spec["runs"] for m in resolve_run(config, r)["models"]})


def study_members(config: dict, study: str) -> list[StudyMember]:
    """Every (model, run) of a study, models outer and runs in the study's order; a run appears
    for the models it trains on."""
    spec = config["studies"][study]
    out = []
    for model in study_models(config, spec):
        for name in spec["runs"]:
            run = resolve_run(config, name)
            if model not in run["models"]:
                continue
            final = run["training"]["steps"]
            steps = checkpoint_steps_of(run) if spec.get("checkpoints") == "all" else [final]
            out.append(StudyMember(model, name, study_seeds(config, spec, name), steps, final))
    return out


def conversion_jobs(config: dict) -> list[Conversion]:
    """Every (model, run, seed) to train: each run on its models with its seeds, plus the seeds
    and models each study asks of it."""
    jobs = set()
    for name in config["runs"]:
        run = resolve_run(config, name)
        jobs.update(Conversion(m, name, s) for m in run["models"] for s in run["seeds"])
    for study in config["studies"]:
        jobs.update(Conversion(m.model, m.run, s) for m in study_members(config, study) for s in m.seeds)
    return sorted(jobs)


def eval_jobs(config: dict) -> tuple[list[CheckpointEval], list[TeacherEval]]:
    """What the studies evaluate: conversion checkpoints, and the AR teachers of the studies'
    models on every benchmark the study uses."""
    conversions, teachers = set(), set()
    for study, spec in config["studies"].items():
        for m in study_members(config, study):
            conversions.update(
                CheckpointEval(e, m.model, m.run, s, k) for e in spec["evals"] for s in m.seeds for k in m.steps
            )
            teachers.update(TeacherEval(e, m.model) for e in spec["evals"])
    return sorted(conversions), sorted(teachers)


# --- AR-MAP -------------------------------------------------------------------------------------


class TeacherDPO(NamedTuple):
    model: str
    pdomain: str
    seed: int

    @property
    def path(self) -> str:
        return layout.teacher_dpo_dir(self.model, self.pdomain, self.seed)


class DLMDomain(NamedTuple):
    """A DLM receiving one preference domain: its spectra."""

    model: str
    run: str
    seed: int
    pdomain: str

    @property
    def spectra(self) -> str:
        return layout.spectra_csv(self.model, self.run, self.seed, self.pdomain)


class DirectBaseline(NamedTuple):
    """A DLM preference-optimised directly on one domain's pairs by ``objective`` (dpo, simpo)."""

    model: str
    run: str
    seed: int
    pdomain: str
    objective: str

    @property
    def path(self) -> str:
        return layout.direct_dir(*self)


class GammaSearch(NamedTuple):
    model: str
    run: str
    seed: int
    pdomain: str
    merge: str

    @property
    def path(self) -> str:
        return layout.gamma_curve(self.model, self.run, self.seed, self.pdomain, self.merge)


class DerivedEval(NamedTuple):
    """A model AR-MAP derives from a conversion checkpoint (``name``: ``layout.armap_name`` or
    ``layout.direct_name``), on one benchmark."""

    benchmark: str
    model: str
    run: str
    seed: int
    name: str

    @property
    def path(self) -> str:
        return layout.derived_eval_path(self.benchmark, self.model, self.run, self.seed, self.name)


class TeacherDPOEval(NamedTuple):
    benchmark: str
    model: str
    pdomain: str
    seed: int

    @property
    def path(self) -> str:
        return layout.teacher_dpo_eval_path(self.benchmark, self.model, self.pdomain, self.seed)


@dataclass(frozen=True)
class ArmapJobs:
    dpo: list[TeacherDPO]
    spectra: list[DLMDomain]
    search: list[GammaSearch]
    direct: list[DirectBaseline]
    dlms: list[Conversion]
    evals: list[DerivedEval | TeacherDPOEval]

    def outputs(self) -> list[str]:
        return (
            [j.path for j in self.dpo]
            + [j.spectra for j in self.spectra]
            + [j.path for j in self.search]
            + [j.path for j in self.direct]
            + [j.path for j in self.evals]
        )


def armap_domains(config: dict) -> list[str]:
    """Preference domains of AR-MAP's DPO: each searched domain, and all of them together."""
    return list(config["armap"]["domains"]) + ["all"]


def search_seeds(config: dict, merge: str) -> list[int]:
    """Seeds on which one merge's gamma is searched: its armap.merge_seeds entry, else armap.seeds."""
    a = config["armap"]
    return a.get("merge_seeds", {}).get(merge, a["seeds"])


def dlm_dpo_seeds(config: dict) -> list[int]:
    """Seeds on which the direct baselines (DLM DPO, and SimPO where configured) run:
    armap.dlm_dpo_seeds, else armap.seeds."""
    a = config["armap"]
    return a.get("dlm_dpo_seeds", a["seeds"])


DIRECT_OBJECTIVES = ("dpo", "simpo")  # armap.dlm_<objective>: AR-MAP's baselines on the DLM


def direct_objectives(config: dict) -> list[str]:
    """The baselines trained directly on the DLM: DPO with VRPO's estimator (``armap.dlm_dpo``),
    and SimPO where ``armap.dlm_simpo`` is configured."""
    return [o for o in DIRECT_OBJECTIVES if f"dlm_{o}" in config["armap"]]


def direct_settings(config: dict, objective: str) -> dict:
    """The settings a direct baseline's job trains with: its section, naming its objective."""
    return {**config["armap"][f"dlm_{objective}"], "objective": objective}


def armap_dlms(config: dict) -> list[Conversion]:
    """The DLMs that receive AR-MAP's vector: each of armap.runs on its models, at armap.seeds."""
    a = config["armap"]
    return [Conversion(m, r, s) for r in a["runs"] for m in resolve_run(config, r)["models"] for s in a["seeds"]]


def armap_jobs(config: dict) -> ArmapJobs:
    """AR-MAP's outputs: DPO'd teachers (one per model, domain and seed), and per DLM and domain the
    spectra, gamma searches (one per merge), direct baselines (DPO, SimPO), and the evaluations of the models
    they write."""
    a = config["armap"]
    dlms = armap_dlms(config)
    models = sorted({d.model for d in dlms})
    per_domain = [DLMDomain(*d, pd) for d in dlms for pd in a["domains"]]
    dpo_seeds = dlm_dpo_seeds(config)
    evals = []
    for pd, benches in a["evals"].items():
        for b in benches:
            evals += [TeacherDPOEval(b, m, pd, s) for m in models for s in a["seeds"]]
            if pd in a["domains"]:
                evals += [DerivedEval(b, *d, layout.armap_name(pd, g)) for d in dlms for g in a["eval_merges"]]
                evals += [
                    DerivedEval(b, *d, layout.direct_name(pd, o))
                    for d in dlms
                    if d.seed in dpo_seeds
                    for o in direct_objectives(config)
                ]
    return ArmapJobs(
        # each seed its own DPO'd teacher, so the seeds' spread includes the preference vector's
        dpo=[TeacherDPO(m, pd, s) for m in models for pd in armap_domains(config) for s in a["seeds"]],
        spectra=per_domain,
        search=[GammaSearch(*j, g) for j in per_domain for g in a["merges"] if j.seed in search_seeds(config, g)],
        direct=[DirectBaseline(*j, o) for j in per_domain if j.seed in dpo_seeds for o in direct_objectives(config)],
        dlms=dlms,
        evals=evals,
    )


class RowsKey(NamedTuple):
    """A token_rows folder: its source, the documents chosen from it, the sequence length."""

    source: str
    selection: str
    seq_len: int


def conversion_rows(config: dict, name: str) -> RowsKey:
    """A run's training rows: its source (a prompt set for distillation from one, else its corpus
    cut) with the documents its objective trains on (``methods.registry.training_data``), tokenised
    at its sequence length."""
    run = resolve_run(config, name)
    source, selection = training_data(run, config["data"]["prompt_sets"])
    return RowsKey(source, selection, run["training"]["seq_len"])


def conversion_corpus(config: dict, name: str) -> str:
    """The token_rows folder a run trains on (``conversion_rows``)."""
    return layout.token_rows_dir(*conversion_rows(config, name))


def token_rows_source(config: dict, source: str) -> str:
    """The file a token_rows job reads: a prompt set, a corpus cut, or the manifest of a stream
    that is not written out (read from its source, up to its budget)."""
    if source.startswith("promptset_"):
        return layout.prompt_set_file(source[len("promptset_") :])
    if source == "stream" and not config["data"]["corpus"]["materialize_stream"]:
        return layout.corpus_file("manifest")
    return layout.corpus_file(source)
