"""A conversion run: the wiring of the training loop (``loop``) for one run's settings.

AdamW, linear warm-up + cosine decay, gradient clipping and accumulation, fp32 on CPU / bf16
autocast on GPU (or as configured), seeded, every loss term logged per step to ``log.jsonl`` with
tokens/s (``steplog``), checkpoints every K steps (``checkpointing``: HF folders with the DLM
conventions JSON and the trainer state beside them). A killed run resumes from its last intact
checkpoint, on any number of processes, and ends with the same weights as an uninterrupted one
(every random draw comes from a generator saved in the checkpoint, and batches are a function of the
step). Under ``torchrun`` with several processes each owns its GPU (``distributed``), the model is
sharded with FSDP2 (``sharding``) and each rank takes its share of the batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.attention import set_training_attention
from ..core.conventions import Conventions
from ..core.models import final_checkpoint, load_conventions
from ..core.precision import resolve_dtype
from ..data.token_rows import TokenRows, corpus_rows, row_layout, run_packs
from ..methods.registry import objective_for
from ..provenance import library_versions, read_json, read_jsonl
from .checkpointing import Checkpoints, checkpoint_steps
from .data import Batches
from .distributed import ProcessGroup, barrier, process_group
from .freezing import freeze
from .loop import FLOP_PARTS, Loop, optimizer
from .sharding import device_mesh, shard
from .steplog import StepLog
from .tracking import Tracker

LAUNCH_KEYS = ("activation_checkpointing",)  # training keys that change how a run uses memory, not what it computes


@dataclass(frozen=True)
class TrainJob:
    """One conversion job: the run's resolved settings, the teacher folder and training data it reads, the
    folder it writes (``out_dir``: checkpoints, log.jsonl), its identity (seed, preset, model name), where
    its steps are tracked (backend, project, directory) and how it is launched (the memory planner's
    choices: ``activation_checkpointing``, else the run's setting; ``shard_teacher``, FSDP2 on the frozen
    teacher too; ``gpus``; ``stop_after_hours``: checkpoint and return with ``stopped_at`` set once the next
    checkpoint would pass that time, one segment of a run longer than a job may last). A staged run
    (``init: {run: NAME}``) starts from the final checkpoint of ``init_from`` (that run's manifest)."""

    run: dict
    teacher_dir: Path | str
    corpus_path: Path | str
    out_dir: Path | str
    seed: int
    preset: str
    model_name: str
    tracking: dict | None = None  # None: no tracker ({"backend": "none"})
    launch: dict | None = None  # None: the run's own settings on the processes it finds ({})
    init_from: Path | str | None = None

    def __post_init__(self):  # None given for either: no tracker, the run's own launch settings
        object.__setattr__(self, "tracking", self.tracking or {"backend": "none"})
        object.__setattr__(self, "launch", self.launch or {})

    @property
    def label(self) -> str:
        return f"{self.model_name}/{self.run['name']}/seed{self.seed}"


def run_conventions(run: dict, tokenizer) -> Conventions:
    return Conventions(
        attention=run["attention"],
        shift=run["shift"],
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        block_size=run["block_size"],
    )


def training_batches(corpus_path, objective, tokenizer, seq_len: int, micro: int, seed: int) -> Batches:
    """The run's micro-batches: the objective's own (preference pairs), pre-tokenised rows (a
    ``token_rows`` folder, what the pipeline passes; its documents already chosen for the
    objective), or a JSONL corpus tokenised here."""
    own = objective.batches(corpus_path, tokenizer, seq_len, micro, seed)
    if own is not None:
        return own
    path = Path(corpus_path)
    # document rows of a conversion (training.rows: documents) end in end-of-text filled to the batch's
    # longest row (core.diffusion.collate); a distillation's prompts are read as they are
    run = objective.run
    fill = tokenizer.eos_token_id if run.get("distill") is None and row_layout(run) == "documents" else None
    if path.is_dir():
        rows = TokenRows(path)
        if rows.index["seq_len"] != seq_len:
            raise ValueError(f"{path} holds rows of {rows.index['seq_len']} tokens; the run trains on {seq_len}")
        return Batches(rows, micro, seed, tokenizer.pad_token_id, ordered=rows.index["ordered"], fill_id=fill)
    rows = corpus_rows(objective.documents(read_jsonl(path)), tokenizer, seq_len, run_packs(run))
    return Batches(rows, micro, seed, tokenizer.pad_token_id, fill_id=fill)


def load_teacher(teacher_dir, objective, dtype: str, device):
    """The frozen teacher an objective needs, or None: the decoder alone when only its hidden states
    are read (no vocabulary projection held), in bf16 when the run computes in bf16."""
    from transformers import AutoModel, AutoModelForCausalLM

    if not objective.needs_teacher:
        return None
    cls = AutoModelForCausalLM if objective.teacher_head else AutoModel
    teacher = cls.from_pretrained(str(teacher_dir), dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    return teacher.to(device).eval().requires_grad_(False)


def micro_batch_size(training: dict, world: int) -> int:
    """Rows of a micro-batch: ``batch_size`` split into ``grad_accum`` micro-batches, each divisible
    among the processes."""
    micro = training["batch_size"] // training["grad_accum"]
    if micro * training["grad_accum"] != training["batch_size"] or micro % world:
        raise ValueError(
            f"batch_size {training['batch_size']} must split into grad_accum {training['grad_accum']} "
            f"micro-batches divisible by {world} processes"
        )
    return micro


def check_staged(run: dict, init_from) -> None:
    if isinstance(run["init"], dict) != (init_from is not None):
        raise ValueError(
            f"run {run['name']} starts from {run['init']}: "
            + ("give that run's manifest (--init-from)" if init_from is None else "it takes no --init-from")
        )


def initial_model(run: dict, teacher_dir, init_from, seed: int):
    """The student before training, in fp32 on the CPU: a staged run's source weights (verified:
    recorded sha256, finite), the teacher's (``init: ar``), or a fresh one of its architecture."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if init_from is not None:
        from ..core.models import load_model

        return load_model(final_checkpoint(init_from), dtype=torch.float32, device="cpu").model
    if run["init"] == "ar":
        return AutoModelForCausalLM.from_pretrained(str(teacher_dir), dtype=torch.float32)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(teacher_dir)), dtype=torch.float32)


def prepared_student(job: TrainJob, objective, teacher, device):
    """The student on ``device`` with its frozen groups, its parameters counted for the FLOP count
    (before sharding) and activation checkpointing where asked; the frozen parameters' names."""
    run, launch = job.run, job.launch
    model = initial_model(run, job.teacher_dir, job.init_from, job.seed)
    set_training_attention(model, device)
    frozen = freeze(model, run["freeze"])
    objective.count_parameters(model, teacher)
    if launch.get("activation_checkpointing", run["training"].get("activation_checkpointing")):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device), frozen


def shard_models(model, teacher, dtype: str, pg: ProcessGroup, launch: dict) -> None:
    """FSDP2 over the processes: each rank holds a shard of the parameters, gradients and optimizer
    state (of the frozen teacher too when the plan says so)."""
    if pg.world == 1:
        return
    mesh = device_mesh(pg)
    shard(model, dtype, mesh)
    if teacher is not None and launch.get("shard_teacher"):
        shard(teacher, dtype, mesh, frozen=True)


def manifest(job: TrainJob, start: int, log: StepLog, seconds: float, stopped_at, dtype: str) -> dict:
    """What ``train.json`` records (rank 0): steps, checkpoints, time, tokens and FLOPs summed from
    the log (one row per step across a killed attempt and its resumption); a staged run adds its
    source run's tokens and FLOPs (``tokens_with_init``, ``flops.with_init``)."""
    rows = log.rows() if log.enabled else None
    flops = {k: sum(r.get(f"flops_{k}", 0.0) for r in rows) for k in FLOP_PARTS} if rows is not None else None
    run, init_from = job.run, job.init_from
    info = {
        "run": run["name"],
        "model": job.model_name,
        "seed": job.seed,
        "steps": run["training"]["steps"],
        "resumed_from": start,
        "checkpoints": checkpoint_steps(Path(job.out_dir)),
        "wall_seconds": round(seconds, 1),
        "train_seconds": None if rows is None else round(sum(r["step_s"] for r in rows), 4),
        "tokens": None if rows is None else sum(r["tokens"] for r in rows),
        "flops": None if flops is None else {**flops, "total": sum(flops.values())},
        "stopped_at": stopped_at,
        "versions": library_versions(dtype),
    }
    if init_from is not None and rows is not None:  # the whole recipe's compute: this stage and those before it
        source = read_json(init_from)
        info["init"] = {"run": source["run"], "manifest": str(init_from), "steps": source["steps"]}
        info["tokens_with_init"] = info["tokens"] + source.get("tokens_with_init", source["tokens"])
        info["flops"]["with_init"] = info["flops"]["total"] + source["flops"].get("with_init", source["flops"]["total"])
    return info


def checkpoint_info(job: TrainJob, frozen: int, dtype: str) -> dict:
    """What every checkpoint's conventions JSON records of the run that wrote it."""
    run = job.run
    return {
        "method": run["method"],
        "run": run["name"],
        "model": job.model_name,
        "preset": job.preset,
        "seed": job.seed,
        "run_settings": {k: v for k, v in run.items() if k != "name"},
        "frozen_parameters": frozen,
        "versions": library_versions(dtype),
    }


def step_log(out_dir: Path, start: int, pg: ProcessGroup, tracking: dict, name: str, run: dict) -> StepLog:
    """The run's log.jsonl from step ``start`` on, and its tracker, written by the main process."""
    tracker = None
    if pg.main:
        tracker = Tracker(tracking["backend"], tracking.get("directory"), tracking.get("project"), name, run)
    return StepLog(out_dir / "log.jsonl", start=start, enabled=pg.main, tracker=tracker)


def train_run(job: TrainJob) -> dict:
    """Train one conversion run into ``job.out_dir``; returns its manifest (``train.json``'s content)."""
    from transformers import AutoTokenizer

    run, seed, launch, out_dir = job.run, job.seed, job.launch, Path(job.out_dir)
    teacher_dir, tr = job.teacher_dir, run["training"]
    check_staged(run, job.init_from)
    # first: each process owns its GPU before any CUDA work (and stops if it has none the plan gave it)
    with process_group(planned_gpus=launch.get("gpus", 0)) as pg:
        micro = micro_batch_size(tr, pg.world)
        tok = AutoTokenizer.from_pretrained(str(teacher_dir))
        conv = run_conventions(run, tok)
        objective = objective_for(run, conv, seed)
        load_conventions(teacher_dir)  # the teacher folder must be one this project wrote
        batches = training_batches(job.corpus_path, objective, tok, tr["seq_len"], micro, seed)
        dtype = resolve_dtype(tr["dtype"], pg.device)  # auto: bf16 where the device computes it natively
        teacher = load_teacher(teacher_dir, objective, dtype, pg.device)
        model, frozen = prepared_student(job, objective, teacher, pg.device)
        computed = {**run, "training": {k: v for k, v in tr.items() if k not in LAUNCH_KEYS}}
        settings = {"run": computed, "seed": seed, "teacher": str(teacher_dir)}
        info = {**conv.to_dict(), **checkpoint_info(job, len(frozen), dtype)}
        checkpoints = Checkpoints(out_dir, pg, tr, tok, settings, info)
        checkpoints.prepare()  # settings kept or superseded, corrupt checkpoints set aside
        shard_models(model, teacher, dtype, pg, launch)
        opt = optimizer(model, tr)
        gen = torch.Generator().manual_seed(seed * 1000)  # masks and timesteps: one stream, the same on every process
        start = checkpoints.resume(model, opt, gen)
        log = step_log(out_dir, start, pg, job.tracking, job.label, run)
        loop = Loop(model, teacher, objective, opt, tr, pg, dtype, gen, log, f"run {run['name']} seed {seed}")
        t_run = time.time()
        try:
            stopped_at = loop.run(batches, start, checkpoints, launch.get("stop_after_hours"))
        finally:
            log.close()
        barrier(pg)
        return manifest(job, start, log, time.time() - t_run, stopped_at, dtype)
