"""The config resolved once: the DAG build (``rules/common.smk``) and each workflow script turn the
checked config into one frozen :class:`Resolved` (its runs, studies, benchmarks, claims and job
lists), and the pipeline, the planner and the reports read that, not the dict."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple

from ..evaluation.suite import BENCHMARK_KINDS, BenchmarkKind
from ..methods.registry import training_data
from ..provenance import deep_merge
from . import layout
from .claims import Claim, declared_claims
from .config import ConfigError
from .jobs import ArmapJobs, CheckpointEval, Conversion, RowsKey, TeacherEval, armap_jobs
from .runs import Run, init_chain, resolve_runs


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of ``eval.benchmarks``: its kind and its settings over the preset's decoding
    defaults (read-only: ``settings`` is a copy)."""

    name: str
    kind: BenchmarkKind
    _settings: dict = field(repr=False)

    @property
    def settings(self) -> dict:
        return copy.deepcopy(self._settings)

    @cached_property
    def headline_metric(self) -> str:
        """Its headline metric (a harness task's own first metric, read from its task file once, else its
        kind's first)."""
        return self.kind.headline_metric(self._settings)

    def headline_value(self, result: dict) -> float:
        """An evaluation's headline metric: its best decoding setting's, for kinds with a row per setting."""
        metric = self.headline_metric
        if self.kind.rows:
            return max(r[metric] for r in result["rows"])
        return result["metrics"][metric]


class StudyMember(NamedTuple):
    """One run of a study on one model: the seeds the study asks of it and the steps it evaluates."""

    model: str
    run: str
    seeds: list[int]
    steps: list[int]
    final_step: int


@dataclass(frozen=True)
class Study:
    """One study of ``studies``: its runs, benchmarks, models and members (``spec``: a copy of its
    config entry, for the keys its table and figure read)."""

    name: str
    runs: tuple[str, ...]
    evals: tuple[str, ...]
    models: tuple[str, ...]
    members: tuple[StudyMember, ...]
    _spec: dict = field(repr=False)

    @property
    def spec(self) -> dict:
        return copy.deepcopy(self._spec)

    def seeds(self, run: str) -> list[int]:
        """Seeds of one of its runs (``run_seeds``, else the study's seeds, else the run's)."""
        return next(m.seeds for m in self.members if m.run == run)


def _study(name: str, spec: dict, runs: dict[str, Run]) -> Study:
    for r in spec["runs"]:
        if r not in runs:
            raise ConfigError(f"studies.{name}.runs", f"{r!r} is not a key of runs")
    models = spec.get("models") or sorted({m for r in spec["runs"] for m in runs[r].models})

    def seeds(run: str) -> list[int]:
        return list(spec.get("run_seeds", {}).get(run, spec.get("seeds", runs[run].seeds)))

    members = []
    for model in models:  # models outer, runs in the study's order; a run for the models it trains on
        for r in spec["runs"]:
            run = runs[r]
            if model in run.models:
                steps = run.checkpoint_steps() if spec.get("checkpoints") == "all" else [run.steps]
                members.append(StudyMember(model, r, seeds(r), steps, run.steps))
    return Study(name, tuple(spec["runs"]), tuple(spec["evals"]), tuple(models), tuple(members), copy.deepcopy(spec))


@dataclass(frozen=True)
class Resolved:
    """The checked config resolved once. ``config`` is the dict it was resolved from (Snakemake's own
    config, which jobs' params slice); everything else is read from the typed fields and methods."""

    config: dict = field(repr=False)
    runs: Mapping[str, Run]
    benchmarks: Mapping[str, Benchmark]

    def run(self, name: str) -> Run:
        if name not in self.runs:
            raise ConfigError(f"runs.{name}", f"no such run (known: {', '.join(self.runs)})")
        return self.runs[name]

    @property
    def preset(self) -> str:
        return self.config["preset"]

    @cached_property
    def studies(self) -> Mapping[str, Study]:
        return MappingProxyType({name: _study(name, spec, self.runs) for name, spec in self.config["studies"].items()})

    @cached_property
    def claims(self) -> tuple[Claim, ...]:
        return tuple(declared_claims(self.config))

    @cached_property
    def conversions(self) -> list[Conversion]:
        """Every (model, run, seed) to train: each run on its models with its seeds, plus the seeds
        and models each study asks of it."""
        jobs = {Conversion(m, name, s) for name, run in self.runs.items() for m in run.models for s in run.seeds}
        for study in self.studies.values():
            jobs.update(Conversion(m.model, m.run, s) for m in study.members for s in m.seeds)
        return sorted(jobs)

    @cached_property
    def evals(self) -> tuple[list[CheckpointEval], list[TeacherEval]]:
        """What the studies evaluate: conversion checkpoints, and the AR teachers of the studies'
        models on every benchmark the study uses."""
        conversions, teachers = set(), set()
        for study in self.studies.values():
            for m in study.members:
                conversions.update(
                    CheckpointEval(e, m.model, m.run, s, k) for e in study.evals for s in m.seeds for k in m.steps
                )
                teachers.update(TeacherEval(e, m.model) for e in study.evals)
        return sorted(conversions), sorted(teachers)

    @cached_property
    def armap(self) -> ArmapJobs:
        """AR-MAP's jobs, for the DLMs that receive its vector: each of armap.runs on its models, at armap.seeds."""
        a = self.config["armap"]
        dlms = [Conversion(m, r, s) for r in a["runs"] for m in self.run(r).models for s in a["seeds"]]
        return armap_jobs(a, dlms)

    def conversion_settings(self, name: str) -> dict:
        """What a run trains with: its settings without the job selection (models, seeds), so adding
        a model or a seed elsewhere does not retrain existing runs; a run started from another one
        carries that one's settings (it changes when they do)."""
        run = self.run(name)
        out = {k: v for k, v in run.as_dict().items() if k not in ("models", "seeds")}
        if run.init_run:
            out["init"] = {"run": run.init_run, "settings": self.conversion_settings(run.init_run)}
        return out

    def init_manifest(self, model: str, name: str, seed) -> list[str]:
        """The manifest of the run a run starts from, on the same model and seed ([] when it starts
        from the teacher or from scratch)."""
        init = self.run(name).init_run
        return [layout.conversion_manifest(model, init, seed)] if init else []

    def conversion_rows(self, name: str) -> RowsKey:
        """A run's training rows: its source (a prompt set for distillation from one, else its corpus
        cut) with the documents its objective trains on (``methods.registry.training_data``), tokenised
        at its sequence length."""
        run = self.run(name)
        source, selection = training_data(run, self.config["data"]["prompt_sets"])
        return RowsKey(source, selection, run["training"]["seq_len"])

    def conversion_corpus(self, name: str) -> str:
        """The token_rows folder a run trains on (``conversion_rows``)."""
        return layout.token_rows_dir(*self.conversion_rows(name))

    def study_config(self, study: str) -> dict:
        """What a study's table and figure read from the config (so other studies' edits rerun
        nothing): its runs, and the runs staged runs start from; a job resolves it again."""
        config = self.config
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


def resolve(config: dict) -> Resolved:
    """``config`` (checked: ``checks.checked_config``) resolved: every run, benchmark and study once."""
    benchmarks = {
        name: Benchmark(name, BENCHMARK_KINDS[spec["kind"]], deep_merge(config["eval"]["decoding"], spec))
        for name, spec in config["eval"]["benchmarks"].items()
    }
    return Resolved(config, MappingProxyType(resolve_runs(config)), MappingProxyType(benchmarks))
