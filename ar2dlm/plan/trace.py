"""A conversion job's training step traced at its real shapes and world size, without a GPU: the
memory the planner's estimate (``memory.estimate``) is checked against.

The student (and the frozen teacher an objective reads) is built on the meta device at the job's
model shape, sharded with the trainer's own ``sharding.shard`` over a fake process group of the
planned world size (torch's ``fake`` backend: collectives return at once), materialised as fake
tensors (``FakeTensorMode``: shapes and dtypes, no storage), and stepped through the run's own
objective (``objective.terms``) and optimizer in bf16 autocast at the planned rows per GPU, with the
planned activation checkpointing and teacher placement. FSDP2's memory tracker (``FSDPMemTracker``)
counts every tensor of the second step (the first creates the optimizer state), as rank 0 of the job.

What a trace stands in for, each the GPU route's memory:
- the mesh is on the CPU: FSDP2's CUDA streams cannot start on a build without CUDA; the tensors and
  their sizes are the same;
- attention is ``sdpa`` (fused: no (B, H, L, L) scores kept, as flex attention on a GPU) with the
  dense additive mask the CPU route builds (the GPU's BlockMask is a few KB; the dense one is counted:
  (B, 1, L, L) in bf16, under 1% of any paper job's peak), its keys and values shared by query
  heads as flex attention shares them (transformers would otherwise copy them to every query head
  when a mask is given: two more q-sized tensors a layer);
- values a step reads on the host (a count for the FLOP tally, Adam's step) read as 1, and
  data-dependent selections (the masked positions a loss projects to the vocabulary) take the
  expected share ``MASKED_FRACTION`` of their positions, as the planner does.
An on-policy run's rollouts decode data-dependent lengths, so the trace stands in for them with the
rollout phase at its largest (``_rollout_at_its_largest``): the sharded student gathered for decoding,
the sampler's own prefill of a prompt filling a row (``seq_len`` less one token) and its KV cache
grown to the longest rollout but one block, then the sampler's step of that last block; the training
step then reads the whole canvas (prompt and rollout).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .memory import GB, MASKED_FRACTION, Plan, Shape, model_shape, plan_job

if TYPE_CHECKING:
    from ..pipeline.resolved import Resolved
    from ..pipeline.runs import Run


@dataclass(frozen=True)
class Traced:
    job: str
    world: int
    rows: int  # rows per GPU per micro-batch
    peak_gb: float  # rank 0's peak over the traced step
    parts: dict  # the tracker's categories at the peak (GB): parameters, activations, optimizer state, ...
    planned_gb: float

    @property
    def error(self) -> float:
        """The plan's estimate relative to the traced peak (+: the plan asks for more)."""
        return self.planned_gb / self.peak_gb - 1


def _rollout_at_its_largest(prompt_len: int, after_forward):
    """A stand-in for ``training.objectives.distillation.on_policy_state`` with the memory of its largest moments:
    the gathered student's prefill of ``prompt_len``-token prompts (every position's logits, as the
    sampler computes them) and, with the KV cache grown to all but the last block of the rollout (a
    forward that keeps one position's logits), the sampler's step of the last block. Returns the
    state the training step reads: the prompt and the whole rollout, every response token eligible.
    ``after_forward()`` runs after each of its forwards."""

    def rollout(model, conv, prompts, decoding, row_seeds):
        from ..core.diffusion import NoisedBatch
        from ..core.sampling import CACHE_KW, Decoding, _DynamicDecode
        from ..training.sharding import gathered

        rows, block, length = len(prompts), conv.block_size, decoding.max_new_tokens
        model.eval()  # as the sampler decodes: transformers keeps no KV cache in training mode under checkpointing
        with gathered(model), torch.no_grad():
            d = _DynamicDecode(model, conv, [[0] * prompt_len] * rows, Decoding(length, block), None, None)
            after_forward()
            last = d.P + length - block
            model(
                input_ids=d.ids[:, d.P : last],
                position_ids=d.pos[:, d.P : last],
                attention_mask=d.mask[:, :, d.P : last, :last],
                **{CACHE_KW: d.cache},
                use_cache=True,
                logits_to_keep=1,
            )
            after_forward()
            d.block_logits(last, last + block)
            after_forward()
        model.train()
        width = prompt_len + length
        ids = torch.zeros(rows, width, dtype=torch.long)
        response = torch.ones(rows, width, dtype=torch.bool)
        plens = torch.full((rows,), prompt_len)
        zeros = torch.zeros(rows, width)
        batch = NoisedBatch(ids, ids.clone(), response, zeros, response, torch.ones_like(ids), plens, zeros)
        return batch, rows * width

    return rollout


class _ExpectedSizes(TorchDispatchMode):
    """Answers the step's data-dependent operations, which fake tensors cannot: a host read is 1; a
    ``nonzero`` (the masked positions a loss reads) keeps ``MASKED_FRACTION`` of its positions, and a
    later selection by a boolean mask keeps as many (the same positions: under the 2L layout the
    mask of kept logits spans both copies, twice the positions the noise drew from), or
    ``MASKED_FRACTION`` of its own when no ``nonzero`` came before."""

    def __init__(self):
        super().__init__()
        self.selected = None

    def _kept(self, mask: torch.Tensor) -> int:
        if self.selected is not None and self.selected <= mask.numel():
            return self.selected
        return max(1, int(MASKED_FRACTION * mask.numel()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten._local_scalar_dense.default:
            return 1
        if func is aten.nonzero.default:
            x = args[0]
            self.selected = max(1, int(MASKED_FRACTION * x.numel()))
            return torch.zeros((self.selected, x.dim()), dtype=torch.long, device=x.device)
        if func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            indices = []
            for i in args[1]:
                if i is not None and i.dtype == torch.bool:
                    indices += [torch.zeros(self._kept(i), dtype=torch.long, device=i.device)] * i.dim()
                else:
                    indices.append(i)
            return aten.index.Tensor(args[0], indices)
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_process_group(world: int):
    """Rank 0 of ``world`` processes in torch's fake backend, for the length of the block."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already started: a trace runs in a process of its own")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _meta_models(shape: Shape, run: dict, objective, checkpointing: bool):
    """The student (fp32) and the frozen teacher its objective reads (bf16, or None) on the meta device,
    set up as the trainer sets them up: attention, frozen groups, activation checkpointing."""
    from transformers import AutoModel, AutoModelForCausalLM

    from ..training.freezing import freeze

    cfg = shape.qwen3_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        teacher = None
        if objective.needs_teacher:
            head = AutoModelForCausalLM if objective.teacher_head else AutoModel
            teacher = head.from_config(cfg, dtype=torch.bfloat16).eval().requires_grad_(False)
    model.set_attn_implementation("sdpa")
    freeze(model, run["freeze"])
    objective.count_parameters(model, teacher)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model, teacher


def trace_step(shape: Shape, run: dict, plan: Plan) -> Traced:
    """Rank 0's peak memory over one training step of ``run`` at ``shape`` launched as ``plan``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh

    from ..core.conventions import Conventions
    from ..methods.registry import objective_for
    from ..training.data import MicroBatch
    from ..training.loop import optimizer
    from ..training.schedule import autocast
    from ..training.sharding import shard

    launch, tr = plan.launch, run["training"]
    on_policy = bool((run.get("distill") or {}).get("on_policy"))
    # token ids are never read for their values; the special ones need only be in the vocabulary
    special = shape.vocab - 1
    conv = Conventions(run["attention"], run["shift"], special, special, special, run["block_size"])
    objective = objective_for(run, conv, 0)
    trackers = []  # the traced step's; the tracker accounts one forward per module and step: the rollout's
    # forwards are forgotten by module (the peak is kept) before the training step's
    if on_policy:
        objective.rollout_state = _rollout_at_its_largest(
            tr["seq_len"] - 1, lambda: [t.reset_mod_stats() for t in trackers]
        )
    with fake_process_group(launch.gpus):
        mesh = init_device_mesh("cpu", (launch.gpus,))
        model, teacher = _meta_models(shape, run, objective, launch.activation_checkpointing)
        with FakeTensorMode(allow_non_fake_inputs=True), _ExpectedSizes(), _sdpa_shares_kv_heads():
            shard(model, "bf16", mesh)
            model.to_empty(device="cpu")
            if teacher is not None:
                if launch.shard_teacher:
                    shard(teacher, "bf16", mesh, frozen=True)
                teacher.to_empty(device="cpu")
                teacher.tie_weights()  # to_empty gives each module its own tensor: a tied head shares the embeddings'
            opt = optimizer(model, tr)
            rows, length = launch.rows * launch.gpus, tr["seq_len"]
            ids = torch.zeros(rows, length, dtype=torch.long)
            mb = MicroBatch(
                ids,
                torch.ones_like(ids),
                torch.zeros(rows, dtype=torch.long),
                torch.arange(launch.rows),
                launch.gpus,
                0,
            )
            generator = torch.Generator().manual_seed(0)

            def step():
                with autocast("bf16", "cpu"):
                    # the last step: a curriculum's longest rollout
                    terms = objective.terms(model, teacher, mb, tr["steps"] - 1, generator)
                sum(terms.values()).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            step()  # creates the optimizer state the traced step holds
            tracker = FSDPMemTracker(model, opt)
            trackers.append(tracker)
            with tracker:
                step()
            peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
            # the frozen teacher, resident throughout: its local shard or its whole replica
            held = sum(_local(p).numel() * p.element_size() for p in teacher.parameters()) if teacher else 0
    parts = {str(getattr(k, "value", k)): round(v / GB, 2) for k, v in peak.items() if v and k != "Total"}
    parts["Teacher"] = round(held / GB, 2)
    return Traced(plan.job, launch.gpus, launch.rows, (peak["Total"] + held) / GB, parts, plan.peak_gb)


@contextlib.contextmanager
def _sdpa_shares_kv_heads():
    """transformers' sdpa attention with grouped-query attention's keys and values unrepeated."""
    before = os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRANSFORMERS_SDPA_FORCE_GQA"]
        else:
            os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = before


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def trace_gamma_search(resolved: Resolved, model_name: str) -> Traced:
    """Peak memory of one forward of AR-MAP's gamma search on ``model_name``'s DLM, on its one GPU: the
    fp32 merged weights, and ``min(elbo_samples, batch_size)`` masked copies of a pair of DPO's
    ``max_length`` tokens scored by the search's own ELBO (``core.likelihood.dlm_elbo``) under bf16
    autocast without a weight cache (``armap.dpo.scoring_precision``: here on the CPU), in the
    attention layout of the model's AR-MAP run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    from ..core.conventions import Conventions
    from ..core.likelihood import dlm_elbo
    from .one_gpu import plan_one_gpu_jobs

    config = resolved.config
    job = f"gamma_search/{model_name}"
    planned = {j.job: j for j in plan_one_gpu_jobs(resolved)}
    if job not in planned:
        raise ValueError(f"{job}: the config runs no gamma search on {model_name}")
    a = config["armap"]
    rows, length = min(a["gamma"]["elbo_samples"], a["gamma"]["batch_size"]), a["dpo"]["max_length"]
    run = _armap_run(resolved, model_name)
    shape = model_shape(config["models"][model_name], config["data"]["tokenizer"].get("vocab_size"))
    special = shape.vocab - 1
    conv = Conventions(run["attention"], run["shift"], special, special, special, run["block_size"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.qwen3_config(), dtype=torch.float32).eval()
    model.set_attn_implementation("sdpa")
    with FakeTensorMode(allow_non_fake_inputs=True), _ExpectedSizes(), _sdpa_shares_kv_heads():
        model.to_empty(device="cpu")
        model.tie_weights()  # to_empty gives each module its own tensor: a tied head shares the embeddings'
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            dlm_elbo(model, conv, [([0], [0] * (length - 1))], n_samples=rows, batch_size=rows)
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    parts = {str(getattr(k, "value", k)): round(v / GB, 2) for k, v in peak.items() if v and k != "Total"}
    return Traced(job, 1, rows, peak["Total"] / GB, parts, planned[job].peak_gb)


class _Untracked:
    """A gradient hook handle that is not there (see ``_plain_tracker``)."""

    def remove(self) -> None:
        pass


def _plain_tracker(model, optimizer):
    """torch's ``MemTracker`` over ``model`` and ``optimizer`` counting tensors only, without its module
    accounting, which allows one forward per module and step (DPO's policy and reference forwards run
    the same modules) and hooks every parameter's gradient, frozen ones too (``register_hook``
    refuses them: LoRA's frozen base weights)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_Untracked(), _Untracked())
    tracker.track_external(model, optimizer)
    for hook in ("_pre_fw_hook", "_post_fw_hook", "_pre_bw_hook", "_post_bw_hook"):
        setattr(tracker, hook, lambda *args, **kwargs: None)
    return tracker


def trace_dpo(resolved: Resolved, job: str) -> Traced:
    """Peak memory of one micro-batch step of an AR-MAP DPO job (``dpo_teacher/model``: TRL's DPO on
    the AR teacher; ``dlm_dpo/model``: on the DLM, ELBO-scored) through TRL's own trainer and the
    project's trainer class, with the GPU's settings (bf16, activation checkpointing) and the
    config's LoRA: the model is built on the meta device, the trainer wraps it (its adapters, its
    tokenised pairs of ``max_length`` tokens) without moving it, and it is materialised as fake
    tensors for two steps, the second tracked."""
    with tempfile.TemporaryDirectory() as folder:  # the tokenizer's files and the trainer's output folder
        return _trace_dpo_in(resolved, job, folder)


def _armap_run(resolved: Resolved, model_name: str) -> Run:
    """The run of the DLM AR-MAP transfers to on ``model_name``."""
    return resolved.run(next(d.run for d in resolved.armap.dlms if d.model == model_name))


def _trace_dpo_in(resolved: Resolved, job: str, folder: str) -> Traced:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    from ..armap import dpo
    from ..core.conventions import Conventions
    from ..data.standins import qwen3_tokenizer_dir
    from ..data.tokenization import load_pretrained_tokenizer
    from .one_gpu import plan_one_gpu_jobs

    config = resolved.config
    kind, model_name = job.split("/")
    planned = {j.job: j for j in plan_one_gpu_jobs(resolved)}
    if job not in planned or kind not in ("dpo_teacher", "dlm_dpo"):
        raise ValueError(f"{job}: not a DPO job of the config")
    if planned[job].gpus > 1:
        raise ValueError(f"{job}: planned sharded over {planned[job].gpus} GPUs (the FSDP2 trainer), not TRL's")
    cfg = config["armap"]["dpo" if kind == "dpo_teacher" else "dlm_dpo"]
    shape = model_shape(config["models"][model_name], config["data"]["tokenizer"].get("vocab_size"))
    tok = load_pretrained_tokenizer(str(qwen3_tokenizer_dir()), folder)
    words = " ".join(["word"] * cfg["max_length"])  # every pair at least max_length tokens: TRL cuts it there
    pairs = [{"prompt": "Question:", "chosen": words, "rejected": words + " also"}] * (
        cfg["batch_size"] // cfg.get("grad_accum", 1)
    )
    with torch.device("meta"):
        dtype = torch.bfloat16 if cfg.get("lora") else torch.float32  # as dpo.train_dpo loads it on a GPU
        model = AutoModelForCausalLM.from_config(shape.qwen3_config(), dtype=dtype)
    model.set_attn_implementation("sdpa")
    args = dpo.dpo_args(cfg, 0, folder, gpu=True)
    data = dict(
        args=args,
        train_dataset=dpo._dataset(pairs),
        eval_dataset=dpo._dataset(pairs),
        processing_class=tok,
        peft_config=dpo.lora_config(cfg.get("lora")),
    )
    stay = {"_move_model_to_device": lambda self, model, device: None}  # on meta until materialised
    if kind == "dpo_teacher":
        from trl import DPOTrainer

        trainer = type("TracedDPO", (DPOTrainer,), stay)(model=model, ref_model=None, **data)
    else:
        run = _armap_run(resolved, model_name)
        special = shape.vocab - 1
        conv = Conventions(
            run["attention"], run["shift"], special, tok.eos_token_id, tok.pad_token_id, run["block_size"]
        )
        elbo = dict(conventions=conv, elbo_samples=cfg["elbo_samples"], antithetic=cfg.get("antithetic", False))
        # the masks' seed hashes the token ids' bytes, which fake tensors do not hold (the masks take their
        # expected share of positions here anyway)
        traced = {**stay, "_mask_seed": lambda self, ids: 0}
        trainer = type("TracedDLMDPO", (dpo._dlm_trainer_class(),), traced)(model=model, ref_model=None, **data, **elbo)
    batch = next(iter(trainer.get_train_dataloader()))
    with FakeTensorMode(allow_non_fake_inputs=True), _ExpectedSizes(), _sdpa_shares_kv_heads():
        trainer.model.to_empty(device="cpu")
        trainer.model.get_base_model().tie_weights()  # to_empty gives each module its own tensor
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        if args.activation_checkpointing:  # what the trainer's train() turns on before its first step
            trainer.model.activation_checkpointing_enable(
                activation_checkpointing_kwargs=dict(args.activation_checkpointing_kwargs or {}) or None
            )

        def step():
            trainer.training_step(trainer.model, batch)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        step()  # creates the optimizer state the traced step holds
        tracker = _plain_tracker(trainer.model, trainer.optimizer)
        with tracker:
            step()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    parts = {str(getattr(k, "value", k)): round(v / GB, 2) for k, v in peak.items() if v and k != "Total"}
    rows = 2 * len(pairs)  # chosen and rejected
    return Traced(job, 1, rows, peak["Total"] / GB, parts, planned[job].peak_gb)


def trace_job(resolved: Resolved, job: str) -> Traced:
    """The conversion ``job`` (``model/run``) of ``config`` traced as its plan launches it, or AR-MAP's
    gamma search (``gamma_search/model``)."""
    if job.startswith("gamma_search/"):
        return trace_gamma_search(resolved, job.split("/", 1)[1])
    if job.startswith(("dpo_teacher/", "dlm_dpo/")):
        return trace_dpo(resolved, job)

    config = resolved.config
    model, run_name = job.split("/")
    shape = model_shape(config["models"][model], config["data"]["tokenizer"].get("vocab_size"))
    run = resolved.conversion_settings(run_name)
    plan = plan_job(job, shape, run, config["cluster"])
    if plan.launch is None:
        raise ValueError(f"{job}: no launch fits ({plan.reason})")
    return trace_step(shape, run, plan)
