"""Per-GPU memory and wall time of a conversion job, by part, from the model's shape and the run's
settings; and the launch (nodes, activation checkpointing, teacher placement) that fits a cluster.

Hand-written because no library sizes this trainer: accelerate's ``estimate-memory`` counts weights
and Adam states only, and the parts that decide a diffusion job's fit are its own (the 2L layout
doubles every activation, logits are projected at masked positions only, the teacher's share).

The estimate counts the tensors a step keeps alive at its peak (the start of the backward pass),
from the Qwen3 decoder layer's forward (transformers' modeling_qwen3): the tensors autograd saves in
each layer (RMSNorm keeps an fp32 copy of its input), the logits of masked positions and their
gradient, the attention masks (dense (B, 1, L, L) on CPU; a flex BlockMask's few KB on CUDA), the
frozen teacher and its outputs. FSDP2 shards fp32 parameters, gradients and AdamW's moments over
the job's GPUs and gathers bf16 layers one (plus one prefetched) at a time; the root (embeddings,
LM head, final norm) stays gathered during a step. ``benchmarks/train_memory.py`` measures the
estimate against the peak memory of real steps on CPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.precision import planned_dtype
from ..methods.registry import active_parts, step_length, teacher_of

if TYPE_CHECKING:
    from ..pipeline.resolved import Resolved

GB = 1e9
FP32 = 4
USABLE = 0.9  # of a GPU's memory: the rest for the CUDA context, NCCL buffers and allocator fragmentation


@dataclass(frozen=True)
class Shape:
    """A Qwen3 decoder's widths."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (
            self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate + 2 * self.hidden + 2 * self.head_dim
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        head = 0 if self.tied else self.embedding_params
        return self.embedding_params + head + self.layers * self.layer_params + self.hidden

    @property
    def decoder_params(self) -> int:
        """Without the LM head (a teacher read for its hidden states only)."""
        return self.embedding_params + self.layers * self.layer_params + self.hidden

    def config_dict(self) -> dict:
        """The transformers Qwen3Config keys of this shape."""
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "tie_word_embeddings": self.tied,
        }

    def qwen3_config(self, **overrides):
        """A transformers Qwen3Config of this shape (``overrides``: its other keys)."""
        from transformers import Qwen3Config

        return Qwen3Config(**self.config_dict(), **overrides)

    def kv_cache_bytes(self, tokens: int, act: int) -> int:
        """A KV cache of ``tokens`` tokens (all layers, keys and values) in ``act`` bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * tokens * act

    def layer_activation_bytes(self, act: int, mlp_trained: bool = True) -> int:
        """Bytes autograd keeps per token in one decoder layer, activations in ``act`` bytes (counted
        from the saved tensors of transformers' Qwen3DecoderLayer: ``tests/test_plan.py``). The two
        RMSNorms of the residual stream keep their input in fp32, the normalised input and the output
        (the next linear's input); q's and k's per-head RMSNorms keep their fp32 input and the
        normalised one (rotary embeddings multiply by constants and keep nothing); attention keeps q,
        k, v and its output, which o_proj reads in place; the SwiGLU MLP keeps gate, up, silu(gate)
        and their product, or, frozen (``mlp_trained=False``), neither the product nor its own input,
        which only its weights' gradients read; fp32 RMSNorm scales and attention's log-sum-exp."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        mlp = 4 * act * self.intermediate if mlp_trained else 3 * act * self.intermediate - act * h
        return (
            2 * (FP32 * h + 2 * act * h)
            + (FP32 + act) * (q + kv)
            + 2 * act * (q + kv)
            + mlp
            + FP32 * (2 + 2 * self.heads + self.kv_heads)
        )

    def layer_backward_bytes(self, act: int) -> int:
        """Bytes per token a decoder layer's backward adds to its saved tensors at its peak: the
        gradient of its output and the three intermediate-width gradients of the MLP."""
        return act * (self.hidden + 3 * self.intermediate)


# The Qwen3 base models of the paper preset (their config.json), so a plan needs no download.
QWEN3_SHAPES = {
    "Qwen/Qwen3-0.6B-Base": Shape(1024, 28, 16, 8, 128, 3072, 151936, True),
    "Qwen/Qwen3-1.7B-Base": Shape(2048, 28, 16, 8, 128, 6144, 151936, True),
    "Qwen/Qwen3-4B-Base": Shape(2560, 36, 32, 8, 128, 9728, 151936, True),
    "Qwen/Qwen3-8B-Base": Shape(4096, 36, 32, 8, 128, 12288, 151936, False),
}


def shape_from_config(cfg: dict) -> Shape:
    """From a Hugging Face config.json (dict)."""
    return Shape(
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        cfg.get("tie_word_embeddings", True),
    )


def model_shape(model_cfg: dict, vocab_size: int | None = None) -> Shape:
    """A config's model entry: a pretrained one by its local folder or known hub id, a pretrained-here
    one by its ``arch`` and the tokenizer's vocabulary."""
    if model_cfg.get("model_path") and (Path(model_cfg["model_path"]) / "config.json").is_file():
        return shape_from_config(json.loads((Path(model_cfg["model_path"]) / "config.json").read_text()))
    if model_cfg.get("hub_id") in QWEN3_SHAPES:
        return QWEN3_SHAPES[model_cfg["hub_id"]]
    if "arch" in model_cfg:
        a = model_cfg["arch"]
        return Shape(
            a["hidden_size"],
            a["num_hidden_layers"],
            a["num_attention_heads"],
            a["num_key_value_heads"],
            a["hidden_size"] // a["num_attention_heads"],
            a["intermediate_size"],
            vocab_size or 32768,
            a.get("tie_word_embeddings", True),
        )
    raise ValueError(
        f"cannot size model {model_cfg.get('hub_id')!r}: set model_path to a local folder with config.json"
    )


@dataclass(frozen=True)
class Launch:
    """How a job runs: its GPUs, rows per GPU per micro-batch, and memory-saving choices."""

    nodes: int
    gpus_per_node: int
    rows: int  # rows per GPU per micro-batch
    activation_checkpointing: bool
    shard_teacher: bool
    cuda: bool = True  # flex attention BlockMasks (no dense masks) and bf16 weights of a frozen teacher

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


MASKED_FRACTION = 0.5  # expected share of a row's tokens whose logits a loss reads: t ~ U(0, 1) masks half


@dataclass(frozen=True)
class Sizing:
    """What a method's or loss term's memory hook reads (``ar2dlm.methods.spec.Part.memory``): the
    model, the run, the launch, bytes per activation, the sequence length, positions per row
    through the student (2 x seq_len under the 2L layout) and the positions per GPU whose logits a
    loss reads."""

    shape: Shape
    run: dict
    launch: Launch
    act: int
    seq_len: int
    positions: int
    masked: float


def estimate(shape: Shape, run: dict, launch: Launch) -> dict[str, float]:
    """Peak bytes per GPU by part: parameters, gradients, optimizer, activations, logits, the
    frozen teacher (its weights and one layer's outputs, when the run reads it), masks, then what
    the run's method and loss terms add (``memory`` of each: the hidden states alignment keeps, the
    teacher's logits distillation reads; rollout: an on-policy run's decoding, which peaks apart
    from the training step)."""
    tr = run["training"]
    act = 2 if planned_dtype(tr["dtype"], launch.cuda) == "bf16" else FP32  # autocast computes in bf16 on GPUs
    g = launch.gpus
    sharded = g > 1
    frozen = set(run.get("freeze") or [])
    trainable = shape.params
    if "embeddings" in frozen or "lm_head" in frozen:
        trainable -= shape.embedding_params * (1 if shape.tied else ("embeddings" in frozen) + ("lm_head" in frozen))
    if "mlp" in frozen:
        trainable -= shape.layers * 3 * shape.hidden * shape.intermediate
    T = step_length(run)  # seq_len, or an on-policy step's prompt and rollout
    seq = 2 * T if run["attention"] == "block" else T  # the 2L layout runs clean and noisy copies
    tokens = launch.rows * seq
    out: dict[str, float] = {}
    root = shape.params - shape.layers * shape.layer_params
    if sharded:  # fp32 shards + gathered compute copies: the root and two layers (one prefetched)
        out["parameters"] = FP32 * shape.params / g + act * (root + 2 * shape.layer_params)
        out["gradients"] = FP32 * trainable / g + act * root
    else:
        out["parameters"] = FP32 * shape.params
        out["gradients"] = FP32 * trainable
    out["optimizer"] = 2 * FP32 * trainable / (g if sharded else 1)

    layer = shape.layer_activation_bytes(act, mlp_trained="mlp" not in frozen) * tokens
    if launch.activation_checkpointing:  # each layer's input; one layer recomputed in the backward pass
        out["activations"] = shape.layers * act * shape.hidden * tokens
        out["recompute"] = layer + shape.layer_backward_bytes(act) * tokens
    else:
        out["activations"] = shape.layers * layer

    n = launch.rows * T * MASKED_FRACTION
    chunk = min(n, 1024)
    out["logits"] = (
        2 * act * n * shape.vocab + 3 * FP32 * chunk * shape.vocab
    )  # logits, their gradient, a chunk in fp32

    teacher = 0.0
    reads, head = teacher_of(run)
    if reads:
        t_bytes = 2 if launch.cuda and planned_dtype(tr["dtype"], launch.cuda) == "bf16" else FP32
        weights = shape.params if head else shape.decoder_params
        teacher = t_bytes * weights / (g if launch.shard_teacher else 1)
        if launch.shard_teacher:
            teacher += t_bytes * 2 * shape.layer_params
        teacher += (
            t_bytes * shape.layer_activation_bytes(act) / act * launch.rows * T / 4
        )  # one layer's transient outputs
    out["teacher"] = teacher
    out["masks"] = 0.0 if launch.cuda else launch.rows * seq * seq * (act + 1)
    sizing = Sizing(shape, run, launch, act, T, seq, n)
    for part in active_parts(run):
        for key, value in part.memory(sizing).items():
            out[key] = out[key] + value if key in out else value
    return out


def peak(parts: dict[str, float]) -> float:
    """A step's peak: the training step's parts together, or the rollout phase (the training
    step's states plus the gathered student), whichever is larger. Under activation checkpointing
    the loss's logits and the recomputed layer are alive at different times of the backward pass
    (the logits' gradient is spent before the last layer is recomputed): the larger counts."""
    states = parts["parameters"] + parts["optimizer"] + parts["teacher"]
    phases = ("rollout", "logits", "recompute")
    train = sum(v for k, v in parts.items() if k not in phases) + max(parts["logits"], parts.get("recompute", 0.0))
    return max(train, states + parts.get("rollout", 0.0))


def step_flops(shape: Shape, run: dict, checkpointing: bool) -> float:
    """FLOPs of one optimizer step: 6 x parameters x tokens through the student (8 with
    recomputation; the 2L layout runs both copies), attention's quadratic term, 2 x parameters x
    tokens through the teacher when the run reads one, and what its method and loss terms add (an
    on-policy run's decoding is bandwidth-bound: ``decode_seconds``)."""
    tr = run["training"]
    T = tr["seq_len"]
    rows = tr["batch_size"]
    seq = 2 * T if run["attention"] == "block" else T
    tokens = rows * seq
    dense = (8 if checkpointing else 6) * shape.params * tokens
    attention = (4 if checkpointing else 3) * 4 * shape.layers * shape.heads * shape.head_dim * seq * tokens / 2
    flops = dense + attention
    if teacher_of(run)[0]:
        flops += 2 * shape.params * rows * T
    return flops + sum(part.flops(shape, run, checkpointing) for part in active_parts(run))


def decode_seconds(shape: Shape, run: dict, launch: Launch, cluster: dict) -> float:
    """Seconds per step that memory bandwidth bounds rather than FLOPs (an on-policy rollout's
    decoding), summed over the run's method and loss terms."""
    return sum((part.decode_seconds(shape, run, launch, cluster) for part in active_parts(run)), 0.0)


@dataclass(frozen=True)
class Plan:
    job: str
    launch: Launch | None  # None: nothing fits
    parts: dict
    peak_gb: float
    hours: float
    segments: int  # runtime-limited jobs the run takes (each resumes from the last checkpoint)
    accum: int  # micro-batches per optimizer step (training.grad_accum)
    reason: str = ""


def plan_job(job: str, shape: Shape, run: dict, cluster: dict) -> Plan:
    """The fewest nodes (then no activation checkpointing if it fits, then a replicated teacher)
    whose per-GPU peak fits ``USABLE`` of ``cluster.gpu_memory_gb`` and whose hours fit ``runtime_hours`` if any
    number of nodes up to ``max_nodes`` does; else the fitting launch with the most nodes, run in
    resumable segments."""
    tr = run["training"]
    micro = tr["batch_size"] // tr["grad_accum"]
    budget = USABLE * cluster["gpu_memory_gb"] * GB
    per_node = cluster["gpus_per_node"]
    fitting = []
    for nodes in range(1, cluster["max_nodes"] + 1):
        gpus = nodes * per_node
        if micro % gpus:
            continue
        for ckpt in (False, True):
            for shard_teacher in (False, True):
                launch = Launch(nodes, per_node, micro // gpus, ckpt, shard_teacher)
                parts = estimate(shape, run, launch)
                if peak(parts) <= budget:
                    fitting.append((launch, parts))
                    break
            else:
                continue
            break
    if not fitting:
        launch = Launch(1, per_node, max(1, micro // per_node), True, True)
        parts = estimate(shape, run, launch)
        why = (
            f"needs {peak(parts) / GB:.0f} GB per GPU at {launch.rows} rows per GPU on one node; no launch up to "
            f"{cluster['max_nodes']} nodes fits {cluster['gpu_memory_gb']} GB (micro-batch {micro} rows: raise "
            f"training.grad_accum or lower batch_size / seq_len)"
        )
        return Plan(job, None, parts, peak(parts) / GB, math.nan, 0, tr["grad_accum"], why)

    def hours(launch):
        seconds = (
            tr["steps"]
            * step_flops(shape, run, launch.activation_checkpointing)
            / (launch.gpus * cluster["gpu_tflops"] * 1e12 * cluster["mfu"])
        )
        return (seconds + tr["steps"] * decode_seconds(shape, run, launch, cluster)) / 3600

    in_time = [(candidate, p) for candidate, p in fitting if hours(candidate) <= cluster["runtime_hours"]]
    launch, parts = in_time[0] if in_time else fitting[-1]
    h = hours(launch)
    return Plan(
        job, launch, parts, peak(parts) / GB, h, max(1, math.ceil(h / cluster["runtime_hours"])), tr["grad_accum"]
    )


def plan_jobs(resolved: Resolved) -> list[Plan]:
    """A plan for every (model, run) the config trains (its seeds share it), for ``config["cluster"]``."""

    config = resolved.config
    vocab = config["data"]["tokenizer"].get("vocab_size")
    plans = {}
    for job in resolved.conversions:
        key = f"{job.model}/{job.run}"
        if key not in plans:
            run = resolved.conversion_settings(job.run)
            plans[key] = plan_job(key, model_shape(config["models"][job.model], vocab), run, config["cluster"])
    return list(plans.values())


def plan_bench_train(resolved: Resolved) -> Plan:
    """The training benchmark's launch: the bench model's plan of whichever of its timed runs
    (``bench.train_runs``) needs the most GPUs (aligning reads a teacher too), so every one fits it."""

    config = resolved.config
    model = config["bench"]["model"]
    shape = model_shape(config["models"][model], config["data"]["tokenizer"].get("vocab_size"))
    plans = [
        plan_job(f"bench_train/{model}/{run}", shape, resolved.conversion_settings(run), config["cluster"])
        for run in config["bench"]["train_runs"].values()
    ]
    return max(plans, key=lambda p: (p.launch is not None, p.launch.gpus if p.launch else 0))


def unfit(plans: list[Plan]) -> list[str]:
    """One line per job that fits no launch."""
    return [f"{p.job}: {p.reason}" for p in plans if p.launch is None]
