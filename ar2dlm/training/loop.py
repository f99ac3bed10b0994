"""The one training loop (nanoGPT-style, readable in one sitting): every conversion method
(``trainer.train_run``) and the AR teacher's pretraining (``ar_pretrain.pretrain``) step through it
with their :class:`~ar2dlm.training.objective.Objective`.

A step: the learning rate of the schedule (linear warm-up, cosine decay), ``grad_accum``
micro-batches each of this process's share (``data.share``), the objective's loss terms under the
run's autocast, a finite check on every process before the backward pass (so a non-finite loss
never reaches the optimizer or a checkpoint), gradient clipping, the AdamW step; then one row to the
step log and, at scheduled steps, a checkpoint. A run planned in segments checkpoints and stops once
the next checkpoint would come after its time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from .data import share
from .distributed import ProcessGroup, all_finite, peak_memory, segment_ends, summed, whole_batch_values
from .objective import Objective
from .schedule import autocast, lr_at
from .sharding import grad_norm_value
from .steplog import StepLog

FLOP_PARTS = ("student", "teacher", "rollout")  # what a step's FLOPs are counted for (Objective._count)


def optimizer(model, training: dict) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95) over the trainable parameters, with one weight-decay rule for every
    run: matrices decay by ``training.weight_decay``, 1-D parameters (norms' gains, biases) are
    exempt. Decay pulls a weight toward 0 as a prior on a linear map's size; on a norm's gain it
    would shrink the layer's output scale instead (nanoGPT's and most LM recipes' rule). The
    conversion presets use weight decay 0 (nothing decays), the teacher's pretraining 0.1."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": training["weight_decay"]},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=training["lr"], betas=(0.9, 0.95))


@dataclass
class Loop:
    """What a run trains and how: ``training`` holds steps, grad_accum, lr, warmup_steps, grad_clip
    and log_every; ``generator`` is the stream an objective draws masks from (the same on every
    process; saved in each checkpoint); ``name`` names the run in progress bars and errors."""

    model: torch.nn.Module
    teacher: torch.nn.Module | None
    objective: Objective
    opt: torch.optim.Optimizer
    training: dict
    pg: ProcessGroup
    dtype: str
    generator: torch.Generator
    log: StepLog
    name: str
    params: list = field(init=False)

    def __post_init__(self):
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # the model's order: clipping's sum

    def run(self, batches, start: int = 0, checkpoints=None, stop_after_hours: float | None = None) -> int | None:
        """Steps ``start`` to the last, checkpointing as ``checkpoints`` schedules (none: no
        checkpoints); returns the step a segment stopped after, or None when the run is complete."""
        tr, pg = self.training, self.pg
        # micro-batches from the resumed step on (memory-mapped rows are read ahead by worker processes on GPUs)
        loader = iter(
            batches.loader(
                start * tr["grad_accum"], tr["steps"] * tr["grad_accum"], workers=2 if pg.device.type == "cuda" else 0
            )
        )
        t_run = time.time()
        bar = tqdm(range(start, tr["steps"]), desc=self.name, mininterval=5, disable=not pg.main)
        for step in bar:
            row = self.step(step, loader, checkpoints)
            if step % tr["log_every"] == 0 or step + 1 == tr["steps"]:
                bar.set_postfix(loss=f"{row['loss']:.3f}")
            self.log.log(row)
            if checkpoints is None:
                continue
            save = checkpoints.due(step)
            stop = (
                stop_after_hours is not None
                and not save
                and segment_ends(  # one segment of a longer run
                    t_run, checkpoints.to_next(step) * row["step_s"], stop_after_hours, pg
                )
            )
            if save or stop:
                checkpoints.save(self.model, self.opt, self.generator, step + 1)
            if stop:
                return step + 1
        return None

    def step(self, step: int, loader, checkpoints=None) -> dict:
        """One optimizer step over ``grad_accum`` micro-batches; its log row."""
        tr, pg, accum = self.training, self.pg, self.training["grad_accum"]
        t0 = time.time()
        lr = lr_at(step, tr["steps"], tr["lr"], tr["warmup_steps"])
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        if pg.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pg.device)
        sums: dict[str, float] = {}
        tokens, flops = 0, [0.0] * len(FLOP_PARTS)  # this process's share of the step's FLOPs
        for k in range(accum):
            mb = share(next(loader), pg.rank, pg.world, step * accum + k).to(pg.device)
            with autocast(self.dtype, pg.device.type):
                terms = self.objective.terms(self.model, self.teacher, mb, step, self.generator)
            loss = sum(terms.values()) / accum
            if not all_finite(loss, pg):
                kept = f"; {checkpoints.kept()}" if checkpoints is not None else ""
                raise FloatingPointError(f"non-finite loss ({loss.item()}) at step {step} of {self.name}{kept}")
            loss.backward()
            for name, v in whole_batch_values(terms, pg).items():
                sums[name] = sums.get(name, 0.0) + v / accum
            tokens += self.objective.trained_tokens(mb, step)
            flops = [f + self.objective.last_flops.get(part, 0.0) for f, part in zip(flops, FLOP_PARTS)]
        flops = summed(flops, pg)
        grad_norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(self.params, tr["grad_clip"]))
        self.opt.step()
        dt = time.time() - t0
        return {
            "step": step,
            "loss": sum(sums.values()),
            **sums,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": tokens,
            "tokens_per_s": round(tokens / dt, 1),
            "step_s": round(dt, 4),
            **{f"flops_{part}": v for part, v in zip(FLOP_PARTS, flops)},
            **peak_memory(pg),
        }
