"""How each job of a config is launched, decided once when the DAG is built: the SLURM resources of
the planned jobs (nodes, GPUs, host memory, runtime), their retries, the launch choices a trainer
receives, and the command line that starts a job's processes. The rules read one
:class:`ClusterPlan` (``plan_cluster``) and :func:`launcher`; without a ``cluster`` section nothing
is planned and every job keeps the profile's resources.

A resource that differs between jobs of one rule is a function of the job's wildcards (an object
with ``model``, ``run``, ``objective``, ... attributes, as Snakemake passes), as Snakemake's
``resources:`` takes it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .armap import STOP_FRACTION, over_runtime
from .memory import Plan, model_shape, plan_bench_train, plan_jobs, unfit
from .one_gpu import GpuJob, plan_one_gpu_jobs, sharded_host_gb, unfit_one_gpu
from .tokenize import TokenizePlan

if TYPE_CHECKING:
    from ..pipeline.resolved import Resolved

DPO_HOST_GB = 64  # host memory of a DPO job on one GPU: the policy's and reference's load before the copy
MERGE_MEM_MB, MERGE_RUNTIME_MINUTES = 16000, 240  # a job merging token shards: indexes read, files linked


def dpo_kind(wildcards) -> str:
    """The planned kind of a DPO job (dpo_teacher, or dlm_<objective> for a direct baseline)."""
    return f"dlm_{wildcards.objective}" if "objective" in wildcards.keys() else "dpo_teacher"


@dataclass(frozen=True)
class ClusterPlan:
    """The planned jobs of a config's ``cluster`` (all empty without one)."""

    cluster: dict = field(default_factory=dict)
    conversions: dict[str, Plan] = field(default_factory=dict)  # model/run -> its launch
    gpu_jobs: dict[str, GpuJob] = field(default_factory=dict)  # evaluation and AR-MAP job kinds per model
    bench_train: Plan | None = None  # the training benchmark's launch
    bench_host_gb: float | None = None  # host memory of the training benchmark's node

    def unfit(self) -> list[str]:
        """One line per planned job that fits no launch, no GPU or not its runtime."""
        if not self.cluster:
            return []
        return (
            unfit([*self.conversions.values(), self.bench_train])
            + unfit_one_gpu(list(self.gpu_jobs.values()), self.cluster["gpu_memory_gb"])
            + over_runtime(self.gpu_jobs.values())
        )

    # conversions

    def conversion(self, wildcards) -> Plan | None:
        return self.conversions.get(f"{wildcards.model}/{wildcards.run}")

    def conversion_resources(self) -> dict:
        """Per-job resources of planned conversions. A one-node job's shell starts torchrun itself, one
        process per GPU (so it also runs where there is no SLURM); a multi-node job asks one srun task per
        GPU (``mpi``)."""
        if not self.conversions:
            return {}

        def multi(wc):
            return self.conversion(wc).launch.nodes > 1

        return {
            "nodes": lambda wc: self.conversion(wc).launch.nodes,
            "gpu": lambda wc: self.conversion(wc).launch.gpus,
            "tasks": lambda wc: self.conversion(wc).launch.gpus if multi(wc) else 1,
            "tasks_per_gpu": 0,
            "mpi": lambda wc: "srun" if multi(wc) else "",
            "runtime": f"{self.cluster['runtime_hours']}h",
        }

    def conversion_launch(self, wildcards) -> str:
        """The trainer's launch choices as JSON: the plan's activation checkpointing, teacher placement and
        GPUs, and when the job stops (with a checkpoint) for its retry to resume; {} without a plan (the
        run's own settings)."""
        plan = self.conversion(wildcards)
        if plan is None:
            return "{}"
        # every planned run stops with a checkpoint before its job's limit, one planned in a single segment
        # too: a job slower than its MFU estimate resumes in its retry instead of being killed
        return _launch_json(plan, STOP_FRACTION * self.cluster["runtime_hours"])

    def conversion_retries(self) -> int | None:
        """One per segment after the first of the longest planned run, one for a job slower than its plan
        and one for a failure (Snakemake takes one count per rule); None without a plan (the profile's)."""
        return max(p.segments for p in self.conversions.values()) + 1 if self.conversions else None

    # AR-MAP

    def armap_runtime(self, rule: str) -> dict:
        """A planned AR-MAP job's runtime (``cluster.armap_runtime_hours``, which the planner times it
        against); none without a plan."""
        return {"runtime": f"{self.cluster['armap_runtime_hours'][rule]}h"} if self.gpu_jobs else {}

    def dpo_job(self, wildcards) -> GpuJob:
        return self.gpu_jobs[f"{dpo_kind(wildcards)}/{wildcards.model}"]

    def dpo_resources(self) -> dict:
        """GPUs, host memory and runtime of a planned DPO job: one GPU for LoRA DPO or a full DPO that fits
        it (``DPO_HOST_GB``), else the planner's GPUs of one node, torchrun starting one process per GPU,
        each loading the model in fp32 and the reference in bf16 before sharding them (the planner's host
        memory)."""
        if not self.gpu_jobs:
            return {}
        hours = self.cluster["armap_runtime_hours"]
        return {
            "gpu": lambda wc: self.dpo_job(wc).gpus,
            "mem_mb": lambda wc: round(1000 * (self.dpo_job(wc).host_gb or DPO_HOST_GB)),
            "runtime": lambda wc: round(60 * hours[dpo_kind(wc)]),  # minutes
        }

    def dpo_launch(self, wildcards) -> str:
        """A planned DPO job's launch as JSON: its GPUs (a job step that sees fewer stops at once), and it
        saves and stops at ``STOP_FRACTION`` of its runtime, for its retry to resume; {} without a plan."""
        if not self.gpu_jobs:
            return "{}"
        hours = self.cluster["armap_runtime_hours"][dpo_kind(wildcards)]
        return json.dumps({"gpus": self.dpo_job(wildcards).gpus, "stop_after_hours": round(STOP_FRACTION * hours, 2)})

    def dpo_retries(self, *kinds: str) -> int | None:
        """Retries of the DPO jobs of ``kinds``: one per segment after the first of their longest planned
        run, one for a job slower than its plan and one for a failure; None without a plan."""
        if not self.gpu_jobs:
            return None
        return max((j.segments for name, j in self.gpu_jobs.items() if name.split("/")[0] in kinds), default=1) + 1

    # the training benchmark

    def bench_train_resources(self) -> dict:
        """The planned launch of its largest timed run, started as a conversion is, with host memory for
        each process's load before sharding."""
        if self.bench_train is None:
            return {}
        launch = self.bench_train.launch
        return {
            "nodes": launch.nodes,
            "gpu": launch.gpus,
            "tasks": launch.gpus if launch.nodes > 1 else 1,
            "tasks_per_gpu": 0,
            "mpi": "srun" if launch.nodes > 1 else "",
            "mem_mb": round(1000 * self.bench_host_gb),
        }

    def bench_train_launch(self) -> str:
        """The training benchmark's launch choices as JSON, as a conversion's; {} without a plan."""
        return "{}" if self.bench_train is None else _launch_json(self.bench_train)


def _launch_json(plan: Plan, stop_after_hours: float | None = None) -> str:
    launch = plan.launch
    choices = {
        "activation_checkpointing": launch.activation_checkpointing,
        "shard_teacher": launch.shard_teacher,
        "gpus": launch.gpus,
    }
    if stop_after_hours is not None:
        choices["stop_after_hours"] = round(stop_after_hours, 2)
    return json.dumps(choices)


def plan_cluster(resolved: Resolved) -> ClusterPlan:
    """Every planned job of the config's ``cluster`` (an empty plan without one)."""
    config = resolved.config
    if not config.get("cluster"):
        return ClusterPlan()
    bench = config["bench"]["model"]
    shape = model_shape(config["models"][bench], config["data"]["tokenizer"].get("vocab_size"))
    bench_train = plan_bench_train(resolved)
    return ClusterPlan(
        cluster=config["cluster"],
        conversions={p.job: p for p in plan_jobs(resolved)},
        gpu_jobs={j.job: j for j in plan_one_gpu_jobs(resolved)},
        bench_train=bench_train,
        bench_host_gb=sharded_host_gb(shape, bench_train.launch.gpus_per_node) if bench_train.launch else None,
    )


def tokenize_resources(plan: TokenizePlan, tokenizes: bool) -> dict:
    """SLURM memory and runtime of a token_rows job: the plan's for a job that tokenises, a merge's
    (``MERGE_MEM_MB``, ``MERGE_RUNTIME_MINUTES``) for one that merges shards."""
    if not tokenizes:
        return {"mem_mb": MERGE_MEM_MB, "runtime": MERGE_RUNTIME_MINUTES}
    return {"mem_mb": plan.mem_mb, "runtime": plan.runtime_minutes}


def launcher(resources, python: str) -> str:
    """What starts a job's processes (``python``: the job environment's interpreter): ``python`` for one
    process; torchrun (through ``ar2dlm.training.torchrun``: the rendezvous host checked, a segment's exit
    status 75 passed through) on one node for several GPUs; for a job given ``mpi`` (a planned job, or a
    profile's choice), srun starts one torchrun per node of the job and the torchruns meet through c10d
    rendezvous on the job's first node (``tasks`` processes in all, or one per GPU)."""
    gpus = int(resources.get("gpu", 0) or 0)
    if resources.get("mpi"):
        nodes = int(resources.get("nodes", 1) or 1)
        per_node = int(resources.get("tasks") or gpus) // nodes
        torchrun = (
            f"exec {python} -m ar2dlm.training.torchrun --nnodes={nodes} --nproc_per_node={per_node} "
            "--rdzv_backend=c10d --rdzv_id=$SLURM_JOB_ID --rdzv_endpoint="
            '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):$((29500 + SLURM_JOB_ID % 1000)) "$@"'
        )
        # the step's one task per node holds that node's GPUs and their CPUs, named here rather than left to
        # the site's srun defaults (a step inherits neither --gpus nor --cpus-per-task from its job)
        cpus = int(resources.get("cpus_per_gpu", 0) or 0) * (gpus // nodes) or int(
            resources.get("cpus_per_task", 0) or 0
        )
        binding = (f" --gpus-per-task={gpus // nodes} --gpu-bind=none" if gpus else "") + (
            f" --cpus-per-task={cpus}" if cpus else ""
        )
        return (
            f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1{binding} --kill-on-bad-exit=1 "
            f"sh -c '{torchrun}' torchrun"
        )
    if gpus > 1:
        return f"{python} -m ar2dlm.training.torchrun --standalone --nproc_per_node={gpus}"
    return python
