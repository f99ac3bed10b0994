"""Job lists: what the preset's grid trains, what its studies evaluate, and AR-MAP's jobs, as named
records that know their output path (``layout``). The Snakefile asks for these outputs; tables,
claims and reports read the same records, so both sides walk one list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from . import layout


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


def armap_domains(armap: dict) -> list[str]:
    """Preference domains of AR-MAP's DPO (``armap``: the config's section): each searched domain, and all
    of them together."""
    return list(armap["domains"]) + ["all"]


def search_seeds(a: dict, merge: str) -> list[int]:
    """Seeds on which one merge's gamma is searched: its armap.merge_seeds entry, else armap.seeds."""
    return a.get("merge_seeds", {}).get(merge, a["seeds"])


def dlm_dpo_seeds(a: dict) -> list[int]:
    """Seeds on which the direct baselines (DLM DPO, and SimPO where configured) run:
    armap.dlm_dpo_seeds, else armap.seeds."""
    return a.get("dlm_dpo_seeds", a["seeds"])


DIRECT_OBJECTIVES = ("dpo", "plain_dpo", "simpo")  # armap.dlm_<objective>: AR-MAP's baselines on the DLM


def direct_objectives(a: dict) -> list[str]:
    """The baselines trained directly on the DLM: DPO with VRPO's estimator (``armap.dlm_dpo``), and
    where configured plain DLM DPO (``armap.dlm_plain_dpo``: independent masks for policy and
    reference) and SimPO (``armap.dlm_simpo``)."""
    return [o for o in DIRECT_OBJECTIVES if f"dlm_{o}" in a]


def direct_settings(a: dict, objective: str) -> dict:
    """The settings a direct baseline's job trains with: its section, naming its objective."""
    return {**a[f"dlm_{objective}"], "objective": objective}


def armap_jobs(a: dict, dlms: list[Conversion]) -> ArmapJobs:
    """AR-MAP's outputs (``a``: the config's ``armap``; ``dlms``: the conversions receiving its vector):
    DPO'd teachers (one per model, domain and seed), and per DLM and domain the spectra, gamma searches
    (one per merge), direct baselines (DPO, SimPO), and the evaluations of the models they write."""
    models = sorted({d.model for d in dlms})
    per_domain = [DLMDomain(*d, pd) for d in dlms for pd in a["domains"]]
    dpo_seeds = dlm_dpo_seeds(a)
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
                    for o in direct_objectives(a)
                ]
    return ArmapJobs(
        # each seed its own DPO'd teacher, so the seeds' spread includes the preference vector's
        dpo=[TeacherDPO(m, pd, s) for m in models for pd in armap_domains(a) for s in a["seeds"]],
        spectra=per_domain,
        search=[GammaSearch(*j, g) for j in per_domain for g in a["merges"] if j.seed in search_seeds(a, g)],
        direct=[DirectBaseline(*j, o) for j in per_domain if j.seed in dpo_seeds for o in direct_objectives(a)],
        dlms=dlms,
        evals=evals,
    )


class RowsKey(NamedTuple):
    """A token_rows folder: its source, the documents chosen from it, the sequence length."""

    source: str
    selection: str
    seq_len: int


def token_rows_source(data: dict, source: str) -> str:
    """The file a token_rows job reads: a prompt set, a corpus cut, or the manifest of a stream
    that is not written out (read from its source, up to its budget)."""
    if source.startswith("promptset_"):
        return layout.prompt_set_file(source[len("promptset_") :])
    if source == "stream" and not data["corpus"]["materialize_stream"]:
        return layout.corpus_file("manifest")
    return layout.corpus_file(source)
