"""Wall time of AR-MAP's jobs against their runtimes (``cluster.armap_runtime_hours``): DPO (TRL's
steps, or the sharded trainer's), the gamma search's ELBO scoring and merges, the spectra's SVDs.

FLOPs run at ``cluster.mfu`` of ``cluster.gpu_tflops`` per GPU, as conversions are timed
(``memory.step_flops``). A forward costs 2 FLOPs per decoder weight per input token (2L tokens
under block attention: the clean and the noisy copy), the LM head only at the positions a loss or
score reads, and attention's scores over half of the square. Training adds the recomputed forward
(gradient checkpointing) and a backward of one forward's cost per product it differentiates: the
activations always, the weights too in full DPO (LoRA trains a few million adapter weights). Each
DPO step also runs the reference forward (for full DPO of a causal model TRL precomputes it once
per pair: at most one forward per row). Reading a model folder is timed at ``READ_GB_S``.

A DPO run longer than its job runs in segments (``ar2dlm.armap.segments``): each job stops itself
at ``STOP_FRACTION`` of its runtime with a checkpoint, and the next resumes; a DLM's held-out
scores before training are computed by the first segment only. A gamma search or the spectra must fit one
job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import FP32, MASKED_FRACTION, Shape

STOP_FRACTION = 0.9  # of a job's runtime, when a segment saves and stops (the rest: final scoring, save)
READ_GB_S = 1.0  # assumed read rate of a model folder's safetensors from a shared filesystem
SVD_TFLOPS = 1.0  # assumed rate of torch.linalg.svdvals (cuSOLVER, fp32: bidiagonalisation is bandwidth-bound)


@dataclass(frozen=True)
class JobTime:
    hours: float  # the whole run (every segment)
    segments: int  # jobs it takes (0: it cannot progress within one job's runtime)
    longest_hours: float  # the longest job's wall time, within runtime_hours when the plan holds
    runtime_hours: float

    @property
    def fits(self) -> bool:
        return self.segments > 0 and self.longest_hours <= self.runtime_hours


def forward_flops(shape: Shape, rows: int, seq: int, scored: float) -> float:
    """One forward of ``rows`` sequences of ``seq`` input tokens, the LM head at ``scored`` positions."""
    body = 2 * shape.layers * shape.layer_params * rows * seq
    attention = 4 * shape.layers * shape.heads * shape.head_dim * seq * seq / 2 * rows
    return body + attention + 2 * shape.vocab * shape.hidden * scored


@dataclass(frozen=True)
class DpoRecipe:
    """What a DPO-family job trains: the model's shape, its section's settings (``armap.dpo`` or a
    direct baseline's), whether the model is a DLM (ELBO scores) and whether a DLM's rows take the
    2L layout (``two_copy``: block attention)."""

    shape: Shape
    cfg: dict
    diffusion: bool
    two_copy: bool = False

    def scoring(self) -> ElboScoring:
        """How the job's held-out ELBO scores are computed."""
        return ElboScoring(self.shape, self.cfg["max_length"], self.two_copy)


@dataclass(frozen=True)
class ElboScoring:
    """A DLM scoring pairs cut to ``length`` tokens by their ELBO (2L rows when ``two_copy``)."""

    shape: Shape
    length: int
    two_copy: bool

    def flops(self, pairs: int, samples: int) -> float:
        """ELBOs of the chosen and the rejected sequence of ``pairs`` pairs on ``samples`` masks each."""
        seq = 2 * self.length if self.two_copy else self.length
        return 2 * pairs * samples * forward_flops(self.shape, 1, seq, MASKED_FRACTION * self.length)


def dpo_step_flops(recipe: DpoRecipe) -> float:
    """One DPO step: policy (forward, recomputed forward, backward) and reference forward over the
    chosen and rejected rows, ``elbo_samples`` masked copies each for a DLM (twice that with
    antithetic masks); SimPO has no reference, counted all the same (an upper bound)."""
    shape, cfg, diffusion, two_copy = recipe.shape, recipe.cfg, recipe.diffusion, recipe.two_copy
    rows, length = 2 * cfg["batch_size"], cfg["max_length"]
    seq = 2 * length if two_copy and diffusion else length
    passes = cfg.get("elbo_samples", 1) * (2 if cfg.get("antithetic") else 1) if diffusion else 1
    scored = rows * length * (MASKED_FRACTION if diffusion else 1)  # TRL's fused head reads every position
    forward = passes * forward_flops(shape, rows, seq, scored)
    backward = 1 if cfg.get("lora") else 2
    return forward * (2 + backward) + forward


def _seconds(flops: float, cluster: dict, gpus: int = 1) -> float:
    return flops / (gpus * cluster["gpu_tflops"] * 1e12 * cluster["mfu"])


def _read_seconds(shape: Shape, folders: int = 1) -> float:
    return folders * FP32 * shape.params / 1e9 / READ_GB_S


def dpo_time(recipe: DpoRecipe, eval_pairs: int, cluster: dict, runtime_hours: float, gpus: int = 1) -> JobTime:
    """DPO of ``recipe`` on ``gpus`` GPUs (sharded full DPO) in segments of ``runtime_hours``: every
    segment loads the model, the first (a DLM's; every one for a causal model) scores the held-out
    pairs before training, the last scores them after and saves."""
    shape, cfg = recipe.shape, recipe.cfg
    train = cfg["steps"] * _seconds(dpo_step_flops(recipe), cluster, gpus)
    save = _read_seconds(shape)
    if recipe.diffusion:  # reference and policy ELBOs before training (kept for the segments after), policy after
        score = _seconds(recipe.scoring().flops(eval_pairs, cfg["eval_elbo_samples"]), cluster)
        return segmented(train, _read_seconds(shape), 2 * score, score + save, runtime_hours)
    # TRL's evaluate before (every segment) and after: policy and reference forwards of every held-out row
    rows = 2 * eval_pairs
    score = _seconds(2 * forward_flops(shape, rows, cfg["max_length"], rows * cfg["max_length"]), cluster)
    return segmented(train, _read_seconds(shape) + score, 0.0, score + save, runtime_hours)


def segmented(train: float, load: float, first: float, last: float, runtime_hours: float) -> JobTime:
    """``train`` seconds in jobs that each stop training at ``STOP_FRACTION`` of ``runtime_hours``
    (a DPO job always runs with that stop: a slower GPU than planned costs a segment, not the run)
    after loading (``load``; the first job also spends ``first`` before training), the last job
    then spending ``last`` (final scoring and save) in what is left of its runtime."""
    limit = runtime_hours * 3600
    budget = STOP_FRACTION * limit - load  # training (and the first job's scoring) in one job
    total = load + first + train + last
    if budget <= first or last > limit - STOP_FRACTION * limit:
        return JobTime(total / 3600, 0, total / 3600, runtime_hours)
    if train <= budget - first:
        return JobTime(total / 3600, 1, total / 3600, runtime_hours)
    segments = 1 + math.ceil((train - (budget - first)) / budget)
    rest = train - (budget - first) - (segments - 2) * budget  # the last job's training
    total += (segments - 1) * load
    return JobTime(total / 3600, segments, max(STOP_FRACTION * limit, load + rest + last) / 3600, runtime_hours)


def gamma_time(scoring: ElboScoring, gamma: dict, eval_pairs: int, cluster: dict, runtime_hours: float) -> JobTime:
    """A gamma search: the reference and each gamma of the grid scored on every held-out pair; each
    merge (the grid's, the reference's and gamma_hat's) reads three folders; the result is saved."""
    scores = (1 + len(gamma["grid"])) * scoring.flops(eval_pairs, gamma["elbo_samples"])
    seconds = _seconds(scores, cluster) + _read_seconds(scoring.shape, 1 + 3 * (len(gamma["grid"]) + 2) + 1)
    return JobTime(seconds / 3600, 1, seconds / 3600, runtime_hours)


def svd_flops(m: int, n: int) -> float:
    """Singular values of an m x n matrix: Householder bidiagonalisation, 4 m n^2 - 4 n^3 / 3 (m >= n)."""
    m, n = max(m, n), min(m, n)
    return 4 * m * n * n - 4 * n**3 / 3


def spectra_time(shape: Shape, runtime_hours: float) -> JobTime:
    """The singular values of both task vectors of every matrix, from three folders read once."""
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    layer = 2 * svd_flops(q, h) + 2 * svd_flops(kv, h) + 3 * svd_flops(i, h)
    matrices = shape.layers * layer + (1 if shape.tied else 2) * svd_flops(shape.vocab, h)
    seconds = 2 * matrices / (SVD_TFLOPS * 1e12) + _read_seconds(shape, 3)
    return JobTime(seconds / 3600, 1, seconds / 3600, runtime_hours)


def over_runtime(jobs) -> list[str]:
    """One line per planned job whose time does not fit its runtime (``jobs``: objects with ``job``
    and ``time``, a :class:`JobTime` or None)."""
    out = []
    for j in jobs:
        t = j.time
        if t is None or t.fits:
            continue
        why = "a segment cannot progress within it" if t.segments == 0 else f"takes {t.longest_hours:.1f} h in one job"
        out.append(
            f"{j.job}: {why}, over its runtime of {t.runtime_hours:g} h ({t.hours:.1f} h in all; "
            "cluster.armap_runtime_hours)"
        )
    return out
