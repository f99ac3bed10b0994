"""A TRL DPO job that outlives its time limit: it runs in segments, each a job that resumes from the
last checkpoint of the one before (transformers' own ``checkpoint-<k>/`` folders: weights or
adapter, optimizer, scheduler, RNG states, trainer state).

The checkpoints live in ``<out>.train/`` beside the output, which no job deletes until the run is
complete; a changed config moves them aside (``<out>.train.superseded-<time>``, never deleted)
rather than resuming a run of other settings. A segment planned to end before its job's limit
saves and stops by itself (``StopBeforeLimit``); a job killed at the limit loses the steps since
its last periodic checkpoint. The result is written beside the output and renamed into place only
when complete, so a failed or stopped job never overwrites an earlier one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch

from ..core.models import save_model
from ..provenance import read_json, settings_hash, write_json

SETTINGS = "settings.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_STATE = "trainer_state.json"  # transformers writes it last: a checkpoint without it was interrupted


def work_dir(out_dir, settings: dict) -> Path:
    """``<out>.train/`` for a run of ``settings`` (made JSON-plain first): the checkpoints of a run
    with other settings are moved aside first."""
    work = Path(f"{out_dir}.train")
    settings = json.loads(json.dumps(settings, sort_keys=True, default=str))
    recorded = work / SETTINGS
    if work.is_dir() and (not recorded.is_file() or read_json(recorded) != settings):
        aside = work.with_name(f"{work.name}.superseded-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(work, aside)
        print(f"checkpoints of other settings moved to {aside}", flush=True)
    work.mkdir(parents=True, exist_ok=True)
    write_json(recorded, settings)
    return work


def run_settings(model_dir, cfg: dict, seed: int, train_rows: list[dict], eval_rows: list[dict]) -> dict:
    """What a resumed segment must share with the segments before it: model, settings, seed and pairs."""
    return {
        "model": str(model_dir),
        "dpo": cfg,
        "seed": seed,
        "train_pairs": settings_hash(train_rows),
        "eval_pairs": settings_hash(eval_rows),
    }


def last_checkpoint(work: Path) -> Path | None:
    """The newest complete ``checkpoint-<k>/`` of ``work`` (None: start afresh); newer ones that a
    kill interrupted while saving are removed (they hold nothing a run can resume)."""
    steps = sorted((int(m.group(1)), p) for p in work.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())
    for _step, path in reversed(steps):
        if (path / _STATE).is_file():
            return path
        print(f"removing {path}: interrupted while saving", flush=True)
        shutil.rmtree(path)
    return None


def checkpoint_step(path: Path | None) -> int | None:
    return None if path is None else int(_CHECKPOINT.match(path.name).group(1))


def stop_before_limit(start: float, hours: float):
    """A transformers callback that saves and stops training once the next optimizer step would end
    more than ``hours`` after ``start`` (the job's start), at the last step's pace with half again
    as margin: what the job leaves of its limit goes to the final evaluation and the save."""
    from transformers import TrainerCallback

    class StopBeforeLimit(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.time()
            step, self.last = now - self.last, now
            if state.global_step < state.max_steps and now - start + 1.5 * step > hours * 3600:
                control.should_save = control.should_training_stop = True
            return control

    return StopBeforeLimit()


def scored_once(path: Path, score):
    """``score()``, computed by the first segment of a run and read back by those that resume it
    (held-out scores of the model before training, which take an hour at 8B)."""
    if path.is_file():
        return torch.load(path, weights_only=True)
    value = score()
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(value, tmp)
    os.replace(tmp, path)
    return value


def publish(model, tokenizer, out_dir, provenance: dict) -> None:
    """Save the result beside ``out_dir`` and rename it into place once complete."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp, provenance)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
