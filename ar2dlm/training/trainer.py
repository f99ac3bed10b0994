"""The one training loop every conversion method runs in (nanoGPT-style, readable in one sitting).

AdamW, linear warm-up + cosine decay, gradient clipping and accumulation, fp32 on CPU / bf16
autocast on GPU (or as configured), seeded, tqdm progress, every loss term logged per step to
JSONL with tokens/s, checkpoints every K steps as HF folders with the DLM conventions JSON (the
consolidated weights, in ``training.export_dtype``) and the trainer state beside them (``state/``:
model and optimizer through ``torch.distributed.checkpoint``, sharded as the run was; the
generators). A killed run resumes from its last checkpoint, on any number of processes, and ends
with the same weights as an uninterrupted one (every random draw comes from a generator saved in
the checkpoint, and batches are a function of the step). ``training.keep_states`` keeps the trainer
state of the last N checkpoints only (the weights of every checkpoint stay). A non-finite loss stops
the run before the optimizer step, so the last good checkpoint is never overwritten. Every file of a
checkpoint is recorded with its sha256; a resume checks them and sets a corrupt checkpoint aside
(``corrupt/``), resuming from the newest intact one. Under
``torchrun`` with several processes the model is sharded with FSDP2 (``sharding``) and each rank
takes its share of the batch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.attention import set_training_attention
from ..core.conventions import Conventions
from ..core.models import CheckpointError, file_sha256, load_conventions, save_model, verify_weights
from ..core.precision import resolve_dtype
from ..pipeline.layout import checkpoint_dir, checkpoint_dirs, final_checkpoint
from ..provenance import library_versions, read_json, read_jsonl, write_json
from ..data.token_rows import TokenRows, corpus_rows, run_packs
from .data import Batches, share
from .objectives import freeze, objective_for
from .schedule import autocast, lr_at
from .sharding import barrier, exported_weights, grad_norm_value, load_trainer_state, save_trainer_state, shard
from .tracking import Tracker

STATE_FILE = "trainer_state.pt"  # the generators and step; written last, with the state/ folder beside it
STATE_DIR = "state"
FLOP_PARTS = ("student", "teacher", "rollout")  # what a step's FLOPs are counted for (Objective._count)
LAUNCH_KEYS = ("activation_checkpointing",)  # training keys that change how a run uses memory, not what it computes


def checkpoint_steps(out_dir: Path) -> list[int]:
    """Steps with a checkpoint (weights and conventions; checkpoints are written whole or not at all)."""
    return sorted(checkpoint_dirs(out_dir))


def resumable_steps(out_dir: Path) -> list[int]:
    """Steps whose checkpoint still holds its trainer state."""
    return sorted(k for k, p in checkpoint_dirs(out_dir).items() if (p / STATE_FILE).is_file())


def _state_hashes(ckpt: Path) -> dict:
    return {str(f.relative_to(ckpt)): file_sha256(f) for f in sorted((ckpt / STATE_DIR).rglob("*")) if f.is_file()}


def verify_checkpoint(ckpt: Path) -> None:
    """A resumable checkpoint's weights and trainer state against the sha256 of each file recorded
    when it was written (the state's in ``trainer_state.pt``, written last)."""
    verify_weights(ckpt)
    try:
        recorded = torch.load(ckpt / STATE_FILE, weights_only=False)["state_sha256"]
    except Exception as exc:  # truncated, or written before hashes were recorded
        raise CheckpointError(f"{ckpt / STATE_FILE} cannot be read ({type(exc).__name__}: {exc})") from exc
    if _state_hashes(ckpt) != recorded:
        raise CheckpointError(f"{ckpt / STATE_DIR} does not match the sha256 of its files recorded when it was written")


def set_aside_corrupt(out_dir: Path) -> list[str]:
    """Move resumable checkpoints that fail ``verify_checkpoint``, newest first, to
    ``corrupt/<name>-<time>/`` (never deleted) until one passes: the run resumes from the newest
    intact one. Returns what was moved and why."""
    moved = []
    for step in reversed(resumable_steps(out_dir)):
        ckpt = checkpoint_dir(out_dir, step)
        try:
            verify_checkpoint(ckpt)
            break
        except CheckpointError as exc:
            target = out_dir / "corrupt" / f"{ckpt.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(ckpt, target)
            moved.append(f"{ckpt.name} -> {target} ({exc})")
            print(f"checkpoint set aside: {moved[-1]}", flush=True)
    return moved


def keep_matching_checkpoints(out_dir: Path, settings: dict) -> dict:
    """Checkpoints resume only a run with the same settings, recorded in each checkpoint. Those of
    other settings (a changed config, or no record) are moved to ``superseded/<time>/``, never
    deleted, and the run starts afresh. Returns the settings as recorded."""
    settings = json.loads(json.dumps(settings, sort_keys=True, default=str))

    def recorded(step):
        path = checkpoint_dir(out_dir, step) / "settings.json"
        return read_json(path) if path.is_file() else None

    if any(recorded(k) != settings for k in checkpoint_steps(out_dir)):
        archive = out_dir / "superseded" / time.strftime("%Y%m%d-%H%M%S")
        archive.mkdir(parents=True)
        for p in out_dir.iterdir():
            if p.name != "superseded":
                os.replace(p, archive / p.name)
    write_json(out_dir / "settings.json", settings)
    return settings


def all_finite(loss: torch.Tensor, world: int) -> bool:
    """Whether the loss is finite on every process (each stops together, none waits on the others)."""
    bad = torch.tensor(0.0 if torch.isfinite(loss) else 1.0, device=loss.device)
    if world > 1:
        torch.distributed.all_reduce(bad)
    return bad.item() == 0


def whole_batch_values(terms: dict, world: int) -> dict:
    """The micro-batch's loss terms as floats: each process's term is its share times the number of
    processes, so their mean over processes is the whole micro-batch's."""
    values = torch.stack([v.detach().float() for v in terms.values()])
    if world > 1:
        torch.distributed.all_reduce(values)
        values = values / world
    return {name: float(v) for name, v in zip(terms, values.cpu())}


def run_conventions(run: dict, tokenizer) -> Conventions:
    return Conventions(attention=run["attention"], shift=run["shift"], mask_token_id=tokenizer.mask_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       block_size=run["block_size"])


def training_batches(corpus_path, objective, tokenizer, seq_len: int, micro: int, seed: int) -> Batches:
    """The run's micro-batches: the objective's own (preference pairs), pre-tokenised rows (a
    ``token_rows`` folder, what the pipeline passes; its documents already chosen for the
    objective), or a JSONL corpus tokenised here."""
    own = objective.batches(corpus_path, tokenizer, seq_len, micro, seed)
    if own is not None:
        return own
    path = Path(corpus_path)
    if path.is_dir():
        rows = TokenRows(path)
        if rows.index["seq_len"] != seq_len:
            raise ValueError(f"{path} holds rows of {rows.index['seq_len']} tokens; the run trains on {seq_len}")
        return Batches(rows, micro, seed, tokenizer.pad_token_id, ordered=rows.index["ordered"])
    rows = corpus_rows(objective.documents(read_jsonl(path)), tokenizer, seq_len, run_packs(objective.run))
    return Batches(rows, micro, seed, tokenizer.pad_token_id)


def load_teacher(teacher_dir, objective, dtype: str, device):
    """The frozen teacher an objective needs, or None: the decoder alone when only its hidden states
    are read (no vocabulary projection held), in bf16 when the run computes in bf16."""
    from transformers import AutoModel, AutoModelForCausalLM

    if not objective.needs_teacher:
        return None
    cls = AutoModelForCausalLM if objective.teacher_head else AutoModel
    teacher = cls.from_pretrained(str(teacher_dir), dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    return teacher.to(device).eval().requires_grad_(False)


def _distributed():
    """(world size, rank, device) under torchrun. On GPUs each process owns ``cuda:LOCAL_RANK``
    before any CUDA work (every later ``.to(device)``, FSDP2's placement and NCCL's communicator
    use it), and the process group is bound to it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return world, rank, device


def train_run(run: dict, teacher_dir, corpus_path, out_dir, *, seed: int, preset: str, model_name: str,
              tracking: dict | None = None, launch: dict | None = None, init_from=None) -> dict:
    """Train one conversion run into ``out_dir``; a staged run (``init: {run: NAME}``) starts from
    the final checkpoint of ``init_from`` (that run's manifest), and its manifest counts that run's
    tokens and FLOPs too (``tokens_with_init``, ``flops.with_init``). ``tracking`` (backend,
    project, directory) also sends each step's log row to an experiment tracker. ``launch`` (the memory planner's choices):
    ``activation_checkpointing`` (else the run's setting), ``shard_teacher`` (FSDP2 on the frozen
    teacher too), ``stop_after_hours`` (checkpoint and return with ``stopped_at`` set once the next
    checkpoint interval would pass that time: one segment of a run longer than a job may last)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    staged = isinstance(run["init"], dict)
    if staged != (init_from is not None):
        raise ValueError(f"run {run['name']} starts from {run['init']}: " + (
            "give that run's manifest (--init-from)" if staged else "it takes no --init-from"))
    world, rank, device = _distributed()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tr = run["training"]
    launch = launch or {}
    micro = tr["batch_size"] // tr["grad_accum"]
    if micro * tr["grad_accum"] != tr["batch_size"] or micro % world:
        raise ValueError(f"batch_size {tr['batch_size']} must split into grad_accum {tr['grad_accum']} micro-batches "
                         f"divisible by {world} processes")
    tok = AutoTokenizer.from_pretrained(str(teacher_dir))
    conv = run_conventions(run, tok)
    objective = objective_for(run, conv, seed)
    load_conventions(teacher_dir)  # the teacher folder must be one this project wrote

    batches = training_batches(corpus_path, objective, tok, tr["seq_len"], micro, seed)

    if staged:  # verified weights (recorded sha256, finite) of the source run's final checkpoint
        from ..core.models import load_model

        init_info = read_json(init_from)
        model = load_model(final_checkpoint(init_from), dtype=torch.float32, device="cpu").model
    elif run["init"] == "ar":
        model = AutoModelForCausalLM.from_pretrained(str(teacher_dir), dtype=torch.float32)
    else:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(teacher_dir)), dtype=torch.float32)
    set_training_attention(model, device)
    dtype = resolve_dtype(tr["dtype"], device)  # auto: bf16 where the device computes it natively
    teacher = load_teacher(teacher_dir, objective, dtype, device)
    frozen = freeze(model, run["freeze"])
    objective.count_parameters(model, teacher)  # before sharding: the FLOP count's parameter counts
    if launch.get("activation_checkpointing", tr.get("activation_checkpointing")):  # recompute each layer in backward
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    # masks and timesteps: one stream, the same on every process, drawn for the whole micro-batch
    gen = torch.Generator().manual_seed(seed * 1000)

    start = 0
    if rank == 0:
        computed = {**run, "training": {k: v for k, v in tr.items() if k not in LAUNCH_KEYS}}
        settings = keep_matching_checkpoints(out_dir, {"run": computed, "seed": seed, "teacher": str(teacher_dir)})
        set_aside_corrupt(out_dir)
    barrier(world)
    if world > 1:  # FSDP2: each rank holds a shard of the parameters, gradients and optimizer state
        shard(model, dtype)
        if teacher is not None and launch.get("shard_teacher"):
            shard(teacher, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tr["lr"], weight_decay=tr["weight_decay"], betas=(0.9, 0.95))
    done = resumable_steps(out_dir)
    if done:  # weights and optimizer from the trainer state, resharded to this number of processes
        start = done[-1]
        ckpt = checkpoint_dir(out_dir, start)
        load_trainer_state(model, opt, ckpt / STATE_DIR, world)
        gen.set_state(torch.load(ckpt / STATE_FILE, weights_only=False)["generator"])

    log_path = out_dir / "log.jsonl"
    if rank == 0:  # keep the log lines up to the resumed step only
        lines = log_path.read_text().splitlines() if log_path.exists() else []
        log_path.write_text("".join(l + "\n" for l in lines if json.loads(l)["step"] < start))
    t_run = time.time()
    bar = tqdm(range(start, tr["steps"]), desc=f"{run['name']} seed {seed}", mininterval=5, disable=rank != 0)
    tracking = tracking or {"backend": "none"}
    tracker = Tracker(tracking["backend"], tracking.get("directory"), tracking.get("project"),
                      f"{model_name}/{run['name']}/seed{seed}", run) if rank == 0 else None
    # micro-batches from the resumed step on (memory-mapped rows are read ahead by worker processes on GPUs)
    loader = iter(batches.loader(start * tr["grad_accum"], tr["steps"] * tr["grad_accum"],
                                 workers=2 if device.type == "cuda" else 0))
    stop_after = launch.get("stop_after_hours")
    stopped_at = None
    for step in bar:
        t0 = time.time()
        lr = lr_at(step, tr["steps"], tr["lr"], tr["warmup_steps"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        tokens = 0
        flops = torch.zeros(len(FLOP_PARTS), dtype=torch.float64, device=device)  # this process's share of the step
        for k in range(tr["grad_accum"]):
            mb = share(next(loader), rank, world, step * tr["grad_accum"] + k).to(device)
            with autocast(dtype, device.type):
                terms = objective.terms(model, teacher, mb, step, gen)
            loss = sum(terms.values()) / tr["grad_accum"]
            if not all_finite(loss, world):
                last = checkpoint_steps(out_dir)
                raise FloatingPointError(f"non-finite loss ({loss.item()}) at step {step} of run {run['name']}; the last "
                                         f"good checkpoint (step {last[-1] if last else 'none'}) is kept")
            loss.backward()
            for name, v in whole_batch_values(terms, world).items():
                sums[name] = sums.get(name, 0.0) + v / tr["grad_accum"]
            tokens += objective.trained_tokens(mb, step)
            flops += torch.tensor([objective.last_flops.get(k, 0.0) for k in FLOP_PARTS], dtype=torch.float64, device=device)
        if world > 1:
            torch.distributed.all_reduce(flops)
        grad_norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"]))
        opt.step()
        dt = time.time() - t0
        save_now = (step + 1) % tr["checkpoint_every"] == 0 or step + 1 == tr["steps"]
        if stop_after is not None and not save_now:  # one segment of a run longer than a job: stop in time
            to_next = tr["checkpoint_every"] - (step + 1) % tr["checkpoint_every"]
            if segment_ends(t_run, to_next * dt, stop_after, world):
                save_now = stopped_at = step + 1
        if rank == 0:
            row = {"step": step, "loss": sum(sums.values()), **sums, "lr": lr, "grad_norm": float(grad_norm),
                   "tokens": tokens, "tokens_per_s": round(tokens / dt, 1), "step_s": round(dt, 4),
                   **{f"flops_{k}": float(v) for k, v in zip(FLOP_PARTS, flops.cpu())}}
            if step % tr["log_every"] == 0 or step + 1 == tr["steps"]:
                bar.set_postfix(loss=f"{row['loss']:.3f}")
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            tracker.log(row, step)

        if save_now:  # every rank takes part: the weights are gathered and the state saved in shards
            save_checkpoint(model, opt, tok, gen.get_state(), out_dir, step + 1, conv, settings if rank == 0 else None, {
                "method": run["method"], "run": run["name"], "model": model_name, "preset": preset, "seed": seed,
                "run_settings": {k: v for k, v in run.items() if k not in ("name",)},
                "frozen_parameters": len(frozen), "versions": library_versions(dtype)}, tr, rank, world)
            if stopped_at:
                break
    if tracker is not None:
        tracker.close()
    barrier(world)
    # the log holds one row per step, across a killed attempt and its resumption
    log = read_jsonl(log_path) if rank == 0 else None
    flops = {k: sum(r.get(f"flops_{k}", 0.0) for r in log) for k in FLOP_PARTS} if log is not None else None
    info = {"run": run["name"], "model": model_name, "seed": seed, "steps": tr["steps"], "resumed_from": start,
            "checkpoints": checkpoint_steps(out_dir), "wall_seconds": round(time.time() - t_run, 1),
            "train_seconds": None if log is None else round(sum(r["step_s"] for r in log), 4),
            "tokens": None if log is None else sum(r["tokens"] for r in log),
            "flops": None if flops is None else {**flops, "total": sum(flops.values())}, "stopped_at": stopped_at,
            "versions": library_versions(dtype)}
    if staged and log is not None:  # the whole recipe's compute: this stage and the stages before it
        info["init"] = {"run": init_info["run"], "manifest": str(init_from), "steps": init_info["steps"]}
        info["tokens_with_init"] = info["tokens"] + init_info.get("tokens_with_init", init_info["tokens"])
        info["flops"]["with_init"] = info["flops"]["total"] + init_info["flops"].get("with_init",
                                                                                    init_info["flops"]["total"])
    return info


def segment_ends(start: float, to_next_checkpoint: float, hours: float, world: int) -> bool:
    """Whether the time left before ``hours`` is too short to reach the next scheduled checkpoint
    (``to_next_checkpoint`` seconds at the last step's pace, with half again as margin); the
    processes agree (the latest estimate decides)."""
    late = torch.tensor(float(time.time() - start + 1.5 * to_next_checkpoint > hours * 3600))
    if world > 1:
        torch.distributed.all_reduce(late, op=torch.distributed.ReduceOp.MAX)
    return bool(late.item())


def save_checkpoint(model, opt, tokenizer, generator_state: torch.Tensor, out_dir: Path, step: int, conv: Conventions,
                    settings: dict | None, info: dict, training: dict, rank: int, world: int) -> Path:
    """Write step_<k>/ (HF weights in ``training.export_dtype``, tokenizer, ar2dlm.json, the run's
    settings; the trainer state in state/ and trainer_state.pt) atomically, then drop the trainer
    state of checkpoints older than the last ``training.keep_states``. Called on every rank."""
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    weights = exported_weights(model, training.get("export_dtype", "fp32"))  # collective when sharded
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(model, tokenizer, tmp, {**conv.to_dict(), **info, "step": step,
                                           "dtype": training.get("export_dtype", "fp32")}, state_dict=weights)
        write_json(tmp / "settings.json", settings)
    barrier(world)
    save_trainer_state(model, opt, tmp / STATE_DIR, world)
    barrier(world)
    if rank == 0:
        torch.save({"generator": generator_state, "step": step, "state_sha256": _state_hashes(tmp)}, tmp / STATE_FILE)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        keep = training.get("keep_states")
        for old in resumable_steps(out_dir)[:-keep] if keep else []:
            shutil.rmtree(checkpoint_dir(out_dir, old) / STATE_DIR)
            (checkpoint_dir(out_dir, old) / STATE_FILE).unlink()
    barrier(world)
    return final
