"""GPU memory of the jobs that run on one GPU: evaluation (decoding and ELBO scoring) and AR-MAP
(DPO, spectra, gamma search), by part, from the model's shape and the config.

Like ``memory`` for conversions, the estimate counts what a job keeps alive at its peak:
- decoding: the weights in the benchmark's dtype, the KV cache of a block-attention model's rows
  (one: the decode engine holds one cache at a time, dropping a prompt-width bucket's before the next's),
  the logits of the positions a step decodes (at most two blocks: the cached path runs the
  previous block with the current one) and their fp32 softmax, and one decoder layer's transient
  activations over the canvas;
- ELBO scoring of evaluations (likelihood, harness loglikelihood): ``rows`` masked copies per
  forward, their logits and the fp32 copy and log-softmax ``token_nll`` makes of them;
- gamma search: the fp32 merge, ``rows`` masked copies of a pair cut to DPO's ``max_length`` per
  forward under bf16 autocast (2L tokens under block attention, with its dense mask), the logits of
  masked positions only and the fp32 chunks of their cross-entropy;
- DPO (TRL, chosen and rejected rows together): frozen bf16 weights plus fp32 LoRA parameters,
  gradients and AdamW moments (or all of them in fp32 for full DPO, and a frozen fp32 reference for
  full DPO of a DLM), activations under gradient checkpointing (a DLM's 2L rows, each of its
  ``elbo_samples`` forwards kept for the backward pass), and the logits a DLM's ELBO keeps (masked
  positions only). Full DPO that one GPU cannot hold is sharded (the FSDP2 trainer,
  ``train_dpo_sharded``) over the fewest GPUs of a node that hold weights, gradients, optimizer
  state and a bf16 reference divided among them;
- spectra: three fp32 copies of the largest matrix, two task-vector matrices and SVD workspace.
A prompt is assumed to take ``PROMPT_TOKENS`` (the plan reads no data at DAG build). AR-MAP's jobs
are also timed against their runtimes (:mod:`ar2dlm.plan.armap`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..core.precision import planned_dtype
from .armap import DpoRecipe, ElboScoring, JobTime, dpo_time, gamma_time, spectra_time
from .memory import FP32, GB, MASKED_FRACTION, USABLE, Shape, model_shape

if TYPE_CHECKING:
    from ..pipeline.resolved import Resolved

PROMPT_TOKENS = 1024
BF16 = 2


def _bytes(dtype: str) -> int:
    return BF16 if planned_dtype(dtype, cuda=True) == "bf16" else FP32


def layer_transient(shape: Shape, tokens: int, act: int) -> float:
    """One decoder layer's activations alive at once without autograd: its input and output, q, k,
    v and the attention output, and the MLP's gate, up and product."""
    qkv = (2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim
    return tokens * act * (2 * shape.hidden + qkv + 3 * shape.intermediate)


def decode_parts(shape: Shape, spec: dict, block: int) -> dict[str, float]:
    """A decoded benchmark (code, maths, throughput, harness generation): ``batch_size`` rows of a
    prompt plus the generation, every step a forward over the canvas (or the current block)."""
    act = _bytes(spec.get("dtype", "bf16"))
    rows = spec["batch_size"]
    length = PROMPT_TOKENS + spec.get("max_new_tokens", spec.get("max_gen_toks", 256))
    return {
        "weights": act * shape.params,
        "kv_cache": shape.kv_cache_bytes(rows * length, act),
        "logits": rows * 2 * block * shape.vocab * act + 2 * FP32 * rows * block * shape.vocab,
        "activations": layer_transient(shape, rows * length, act),
    }


def elbo_parts(shape: Shape, weight_bytes: int, rows: int, length: int) -> dict[str, float]:
    """ELBO scoring without gradients: ``rows`` masked copies of a ``length``-token sequence per forward."""
    act = weight_bytes
    return {
        "weights": weight_bytes * shape.params,
        "logits": rows * length * shape.vocab * (act + 2 * FP32),
        "activations": layer_transient(shape, rows * length, act),
    }


def selected_logits(shape: Shape, scored: float, act: int, kept: int = 1) -> float:
    """Logits of ``scored`` masked positions in ``act`` bytes (``kept`` such tensors alive) and the
    fp32 chunks (at most 1024 rows) their cross-entropy computes."""
    return kept * act * scored * shape.vocab + 3 * FP32 * min(scored, 1024) * shape.vocab


def gamma_parts(shape: Shape, rows: int, length: int, two_copy: bool) -> dict[str, float]:
    """A gamma search's forward: fp32 weights, ``rows`` masked copies of a ``length``-token pair
    under bf16 autocast (the residual stream stays fp32), a dense additive mask (and its bf16 cast)
    and the logits of masked positions."""
    seq = 2 * length if two_copy else length
    return {
        "weights": FP32 * shape.params,
        "logits": selected_logits(shape, rows * length * MASKED_FRACTION, BF16),
        "activations": layer_transient(shape, rows * seq, FP32),
        "masks": rows * seq * seq * (FP32 + BF16 + 1),
    }


def lora_params(shape: Shape, r: int) -> int:
    """Parameters of rank-r adapters on every linear layer of the decoder (peft's all-linear)."""
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
    return shape.layers * r * per_layer


def dpo_parts(recipe: DpoRecipe) -> dict[str, float]:
    """One TRL DPO micro-batch step on a GPU: bf16 compute, gradient checkpointing; a DLM's rows
    in the 2L layout when ``two_copy``."""
    shape, cfg, diffusion, two_copy = recipe.shape, recipe.cfg, recipe.diffusion, recipe.two_copy
    rows = 2 * cfg["batch_size"] // cfg.get("grad_accum", 1)  # chosen and rejected
    tokens = rows * cfg["max_length"] * (2 if diffusion and two_copy else 1)
    # each ELBO forward's layer inputs await the backward (two forwards a draw with antithetic masks)
    passes = cfg.get("elbo_samples", 1) * (2 if cfg.get("antithetic") else 1) if diffusion else 1
    lora = cfg.get("lora")
    if lora:
        trained = lora_params(shape, lora["r"])
        out = {
            "weights": BF16 * shape.params + FP32 * trained,
            "gradients": FP32 * trained,
            "optimizer": 2 * FP32 * trained,
            "reference": 0.0,
        }
    else:
        out = {
            "weights": FP32 * shape.params,
            "gradients": FP32 * shape.params,
            "optimizer": 2 * FP32 * shape.params,
            "reference": FP32 * shape.params if diffusion else 0.0,
        }  # a causal model's are precomputed
    out["activations"] = (
        passes * shape.layers * BF16 * shape.hidden * tokens + shape.layer_activation_bytes(BF16) * tokens
    )
    if diffusion:  # the reference's forward (no gradients) runs beside the policy's kept state
        out["activations"] += layer_transient(shape, tokens, BF16)
    # a DLM's ELBO keeps each forward's logits at masked positions and one gradient of them (the
    # reference's, without gradients, are spent before; ar2dlm.plan.trace.trace_dpo); TRL's fused head
    # scores a causal model in chunks
    scored = rows * cfg["max_length"] * MASKED_FRACTION
    out["logits"] = selected_logits(shape, scored, BF16, passes + 1) if diffusion else 2 * FP32 * 1024 * shape.vocab
    return out


def spectra_parts(shape: Shape) -> dict[str, float]:
    largest = shape.vocab * shape.hidden
    return {"matrices": 5 * FP32 * largest, "svd": 3 * FP32 * shape.hidden**2 + FP32 * largest}


@dataclass(frozen=True)
class GpuJob:
    job: str
    parts: dict
    peak_gb: float
    fits: bool
    gpus: int = 1  # processes of a sharded job (full DPO), one per GPU of one node
    time: JobTime | None = None  # AR-MAP's jobs: hours and segments against the job's runtime
    host_gb: float | None = None  # host memory of a sharded job's node (None: the profile's)

    @property
    def segments(self) -> int:
        return self.time.segments if self.time else 1


def _job(name: str, parts: dict, budget: float, gpus: int = 1) -> GpuJob:
    total = sum(parts.values())
    return GpuJob(name, parts, total / GB, total <= budget, gpus)


SHARDED_PARTS = ("weights", "gradients", "optimizer", "reference")
SPLIT_PARTS = ("activations", "logits")  # each process runs its share of a micro-batch's rows


def dpo_job(name: str, recipe: DpoRecipe, budget: float, gpus_per_node: int) -> GpuJob:
    """DPO on one GPU (TRL) when it fits or trains a LoRA adapter; else full DPO sharded over the
    fewest GPUs of a node (powers of two dividing the micro-batch's pairs, as the trainer splits
    them) that hold it, with a bf16 reference sharded too."""
    shape, cfg = recipe.shape, recipe.cfg
    job = _job(name, dpo_parts(recipe), budget)
    if job.fits or cfg.get("lora"):
        return job
    parts = {**dpo_parts(recipe), "reference": BF16 * shape.params}
    micro = cfg["batch_size"] // cfg.get("grad_accum", 1)
    gpus = 2
    while True:
        job = _job(
            name, {k: v / gpus if k in SHARDED_PARTS + SPLIT_PARTS else v for k, v in parts.items()}, budget, gpus
        )
        if job.fits or 2 * gpus > gpus_per_node or micro % (2 * gpus):
            return replace(job, host_gb=sharded_host_gb(shape, gpus))
        gpus *= 2


HOST_OVERHEAD_GB = 16  # per node: the interpreter, CUDA context, data loading, the page cache a load goes through


def sharded_host_gb(shape: Shape, gpus: int) -> float:
    """Host memory of a node of a sharded trainer's job: every process loads the whole policy in fp32 and
    the reference in bf16 on the CPU before FSDP2 shards them to its GPU, with a tenth over for the
    loader's transient copies."""
    return round(gpus * (FP32 + BF16) * shape.params * 1.1 / GB + HOST_OVERHEAD_GB, 1)


def plan_one_gpu_jobs(resolved: Resolved) -> list[GpuJob]:
    """Every evaluation and AR-MAP job kind the config runs, per model: the largest benchmark of each
    kind the model is evaluated on, DPO of the teacher and of the DLM, spectra and gamma search."""
    config = resolved.config
    budget = USABLE * config["cluster"]["gpu_memory_gb"] * GB
    vocab = config["data"]["tokenizer"].get("vocab_size")
    shapes = {m: model_shape(config["models"][m], vocab) for m in config["models"]}
    conversions, teachers = resolved.evals
    armap = resolved.armap
    # (model, benchmark, run); a teacher's evaluations (its DPO'd ones too) have no run
    evaluated = {(e.model, e.benchmark, getattr(e, "run", "teacher")) for e in [*conversions, *teachers, *armap.evals]}
    jobs: dict[str, GpuJob] = {}
    for model, bench, run in sorted(evaluated):
        shape, benchmark = shapes[model], resolved.benchmarks[bench]
        spec = benchmark.settings
        act = _bytes(spec.get("dtype", "bf16"))
        block = max(
            [(resolved.run(run).block_size if run != "teacher" else None) or spec.get("block_size") or 1]
            + spec.get("block_sizes", [])
        )
        if benchmark.kind.decoded or spec.get("max_gen_toks"):
            parts = decode_parts(shape, spec, block)
        elif benchmark.kind.scores_by_elbo:
            parts = elbo_parts(shape, act, min(spec["elbo_samples"], spec["batch_size"]), PROMPT_TOKENS + 1024)
        else:  # embeddings: one forward of a batch of 512-token texts
            parts = {
                "weights": act * shape.params,
                "activations": layer_transient(shape, spec["batch_size"] * 512, act),
            }
        job = _job(f"evaluate/{model}/{bench}", parts, budget)
        if job.job not in jobs or job.peak_gb > jobs[job.job].peak_gb:
            jobs[job.job] = job
    for job in armap_one_gpu_jobs(resolved, shapes, budget):
        jobs[job.job] = job
    return list(jobs.values())


def _eval_pairs(config: dict, section: dict) -> int:
    """Held-out pairs a job scores: the section's ``eval_pairs``, else every domain's (an all-domain
    job's, the most)."""
    if section.get("eval_pairs"):
        return section["eval_pairs"]
    prefs = config["data"]["preferences"]
    return sum(prefs["domains"][d].get("n_eval", prefs["n_eval"]) for d in config["armap"]["domains"])


def armap_one_gpu_jobs(resolved: Resolved, shapes: dict, budget: float) -> list[GpuJob]:
    """DPO of the teacher and of the DLM, spectra and gamma search per model: memory, and hours
    against ``cluster.armap_runtime_hours``. The DLM's rows take the 2L layout when any of the
    model's AR-MAP runs uses block attention; pairs are cut to their DPO's ``max_length``."""
    from ..pipeline.jobs import direct_objectives

    config, armap = resolved.config, resolved.armap
    a, cluster = config["armap"], config["cluster"]
    runtime = cluster["armap_runtime_hours"]
    rows = min(a["gamma"]["elbo_samples"], a["gamma"]["batch_size"])
    length = a["dpo"]["max_length"]  # the gamma search cuts pairs as the preference vector's DPO did
    jobs = []
    for model in sorted({j.model for j in armap.dpo}):
        shape = shapes[model]
        two_copy = any(resolved.run(d.run).attention == "block" for d in armap.dlms if d.model == model)
        kinds = [("dpo_teacher", a["dpo"], False)] + [(f"dlm_{o}", a[f"dlm_{o}"], True) for o in direct_objectives(a)]
        for kind, cfg, diffusion in kinds:
            recipe = DpoRecipe(shape, cfg, diffusion, two_copy)
            if kind == "dlm_simpo":  # TRL's CPO trainer on one GPU, no reference
                job = _job(f"{kind}/{model}", {**dpo_parts(recipe), "reference": 0.0}, budget)
            else:
                job = dpo_job(f"{kind}/{model}", recipe, budget, cluster["gpus_per_node"])
            time = dpo_time(recipe, _eval_pairs(config, cfg), cluster, runtime[kind], job.gpus)
            jobs.append(replace(job, time=time))
        jobs.append(
            replace(
                _job(f"armap_spectra/{model}", spectra_parts(shape), budget),
                time=spectra_time(shape, runtime["armap_spectra"]),
            )
        )
        gamma = _job(f"gamma_search/{model}", gamma_parts(shape, rows, length, two_copy), budget)
        scoring = ElboScoring(shape, length, two_copy)
        time = gamma_time(scoring, a["gamma"], _eval_pairs(config, a["gamma"]), cluster, runtime["gamma_search"])
        jobs.append(replace(gamma, time=time))
    return jobs


def unfit_one_gpu(jobs: list[GpuJob], gpu_memory_gb: float) -> list[str]:
    return [
        f"{j.job}: needs {j.peak_gb:.0f} GB on {'one GPU' if j.gpus == 1 else f'each of {j.gpus} GPUs'}, "
        f"over {USABLE:.0%} of {gpu_memory_gb:g} GB "
        f"({', '.join(f'{k} {v / GB:.1f}' for k, v in j.parts.items())} GB)"
        for j in jobs
        if not j.fits
    ]
