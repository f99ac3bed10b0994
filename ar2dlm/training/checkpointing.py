"""A run's checkpoints: ``step_<k>/`` folders, written whole or not at all, resumed only by a run of
the same settings, verified before a resume.

A checkpoint holds the Hugging Face weights a study evaluates (consolidated, in
``training.export_dtype``, with the DLM conventions JSON and the sha256 of each weight file), the
run's settings, and the trainer state (``state/``: model and optimizer through
``torch.distributed.checkpoint``, sharded as the run was; ``trainer_state.pt``: the generators, the
step and the sha256 of every state file, written last). ``training.keep_states`` keeps the trainer
state of the last N checkpoints only (the weights of every checkpoint stay).

Hashing is shared by the processes, so no rank hashes the whole trainer state while the others
wait (about 114 GB at 8B; see ``distributed`` for the bound): on save each rank hashes the state
files it wrote, on resume each hashes an even share (by size) of the checkpoint's files, and rank 0
gathers the hashes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch

from ..core.models import WEIGHT_HASHES, checkpoint_dir, checkpoint_dirs, file_sha256, load_conventions, save_model
from ..provenance import read_json, write_json
from .distributed import ProcessGroup, all_gathered, barrier, from_main
from .sharding import exported_weights, load_trainer_state, save_trainer_state

STATE_FILE = "trainer_state.pt"  # the generators, step and state hashes; written last, with the state/ folder beside it
STATE_DIR = "state"
_WRITER = re.compile(r"__(\d+)_\d+\.distcp")  # torch.distributed.checkpoint's file of rank N
_ONE_PROCESS = ProcessGroup()  # the default group: one process on the CPU (frozen, so safe to share)


def checkpoint_steps(out_dir: Path) -> list[int]:
    """Steps with a checkpoint (weights and conventions; checkpoints are written whole or not at all)."""
    return sorted(checkpoint_dirs(out_dir))


def resumable_steps(out_dir: Path) -> list[int]:
    """Steps whose checkpoint still holds its trainer state."""
    return sorted(k for k, p in checkpoint_dirs(out_dir).items() if (p / STATE_FILE).is_file())


def _hashes(folder: Path, names: list[str]) -> dict[str, str | None]:
    """sha256 of each file (None for one that cannot be read)."""
    out = {}
    for name in names:
        try:
            out[name] = file_sha256(folder / name)
        except OSError:
            out[name] = None
    return out


def even_shares(sizes: dict[str, int], world: int) -> list[list[str]]:
    """Files split among ``world`` processes with bytes as even as whole files allow: largest first,
    each to the process with the fewest bytes so far (the largest share is at most an even share
    plus the largest file)."""
    shares, loads = [[] for _ in range(world)], [0] * world
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        least = loads.index(min(loads))
        shares[least].append(name)
        loads[least] += sizes[name]
    return shares


def _plan(ckpt: Path) -> dict[str, tuple[str, int]] | str:
    """Every file of a resumable checkpoint with the sha256 recorded when it was written (weights in
    the conventions JSON, the state in ``trainer_state.pt``) and its size, or why they cannot be read."""
    try:
        recorded = {
            **(load_conventions(ckpt).get(WEIGHT_HASHES) or {}),
            **torch.load(ckpt / STATE_FILE, weights_only=False)["state_sha256"],
        }
    except Exception as exc:  # truncated, or written before hashes were recorded
        return f"{ckpt} cannot be verified: its records cannot be read ({type(exc).__name__}: {exc})"
    state = {str(f.relative_to(ckpt)) for f in (ckpt / STATE_DIR).rglob("*") if f.is_file()}
    if state != {n for n in recorded if n.startswith(f"{STATE_DIR}/")}:
        return f"{ckpt / STATE_DIR} holds other files than those recorded when it was written"
    return {n: (digest, (ckpt / n).stat().st_size if (ckpt / n).is_file() else 0) for n, digest in recorded.items()}


def checkpoint_problem(ckpt: Path, pg: ProcessGroup = _ONE_PROCESS) -> str | None:
    """Why a resumable checkpoint's files do not match the sha256 recorded when they were written
    (a truncated or altered file), or None. Every process calls it and hashes an even share."""
    plan = from_main(_plan(ckpt) if pg.main else None, pg)
    if isinstance(plan, str):
        return plan
    mine = even_shares({n: size for n, (_, size) in plan.items()}, pg.world)[pg.rank]
    seen = {}
    for part in all_gathered(_hashes(ckpt, mine), pg):
        seen.update(part)
    bad = sorted(n for n, (digest, _) in plan.items() if seen.get(n) != digest)
    if bad:
        return f"{ckpt / bad[0]} does not match the sha256 recorded when it was written: truncated or corrupt"
    return None


def set_aside_corrupt(out_dir: Path, pg: ProcessGroup = _ONE_PROCESS) -> list[str]:
    """Move resumable checkpoints that fail verification, newest first, to
    ``corrupt/<name>-<time>/`` (never deleted) until one passes: the run resumes from the newest
    intact one. Every process takes part (each hashes a share). Returns what was moved and why."""
    moved = []
    for step in reversed(from_main(resumable_steps(out_dir) if pg.main else None, pg)):
        ckpt = checkpoint_dir(out_dir, step)
        problem = checkpoint_problem(ckpt, pg)
        if problem is None:
            break
        target = out_dir / "corrupt" / f"{ckpt.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        moved.append(f"{ckpt.name} -> {target} ({problem})")
        if pg.main:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(ckpt, target)
            print(f"checkpoint set aside: {moved[-1]}", flush=True)
        barrier(pg)
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


def written_state_hashes(ckpt: Path, pg: ProcessGroup) -> dict[str, str]:
    """sha256 of every file of ``ckpt``'s trainer state, each process hashing the files it wrote
    (rank 0 also any file of no rank, the metadata), gathered on every process."""
    files = sorted(str(f.relative_to(ckpt)) for f in (ckpt / STATE_DIR).rglob("*") if f.is_file())

    def writer(name):
        match = _WRITER.fullmatch(Path(name).name)
        return int(match.group(1)) if match and int(match.group(1)) < pg.world else 0

    out = {}
    for part in all_gathered(_hashes(ckpt, [n for n in files if writer(n) == pg.rank]), pg):
        out.update(part)
    return dict(sorted(out.items()))


def keep_states(out_dir: Path, keep: int | None) -> None:
    """Drop the trainer state of checkpoints older than the last ``keep`` (all kept for None)."""
    for old in resumable_steps(out_dir)[:-keep] if keep else []:
        shutil.rmtree(checkpoint_dir(out_dir, old) / STATE_DIR)
        (checkpoint_dir(out_dir, old) / STATE_FILE).unlink()


class Checkpoints:
    """One run's checkpoints: ``prepare`` before training (rank 0 keeps those of the same settings;
    every rank helps verify), ``resume`` the newest, ``save`` at ``due`` steps. A checkpoint folder
    holds the weights, ``tokenizer`` and a conventions JSON of ``info`` (the decoding conventions and
    what it records about the run) with the step; ``settings`` are the run's, which decide whether
    an earlier checkpoint is resumable."""

    def __init__(self, out_dir, pg: ProcessGroup, training: dict, tokenizer, settings: dict, info: dict):
        self.out_dir, self.pg, self.training = Path(out_dir), pg, training
        self.tokenizer, self.settings, self.info = tokenizer, settings, info
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def prepare(self) -> None:
        if self.pg.main:
            self.settings = keep_matching_checkpoints(self.out_dir, self.settings)
        barrier(self.pg)
        set_aside_corrupt(self.out_dir, self.pg)

    def resume(self, model, opt, generator: torch.Generator) -> int:
        """Load the newest resumable checkpoint's trainer state, resharded to this number of
        processes; the step to continue from (0: none)."""
        done = from_main(resumable_steps(self.out_dir) if self.pg.main else None, self.pg)
        if not done:
            return 0
        ckpt = checkpoint_dir(self.out_dir, done[-1])
        load_trainer_state(model, opt, ckpt / STATE_DIR, self.pg.world)
        generator.set_state(torch.load(ckpt / STATE_FILE, weights_only=False)["generator"])
        return done[-1]

    def due(self, step: int) -> bool:
        """Whether a checkpoint is scheduled after ``step`` (0-based): every ``checkpoint_every``, and the last."""
        return (step + 1) % self.training["checkpoint_every"] == 0 or step + 1 == self.training["steps"]

    def to_next(self, step: int) -> int:
        """Steps from the end of ``step`` to the next scheduled checkpoint."""
        return self.training["checkpoint_every"] - (step + 1) % self.training["checkpoint_every"]

    def kept(self) -> str:
        last = checkpoint_steps(self.out_dir)
        return f"the last good checkpoint (step {last[-1] if last else 'none'}) is kept"

    def save(self, model, opt, generator: torch.Generator, step: int) -> Path:
        """Write step_<k>/ atomically (every rank takes part: the weights are gathered and the state
        saved in shards), then drop the trainer state beyond ``keep_states``."""
        pg, export = self.pg, self.training.get("export_dtype", "fp32")
        final = checkpoint_dir(self.out_dir, step)
        tmp = final.with_name(f".{final.name}.tmp")
        weights = exported_weights(model, export)  # collective when sharded
        if pg.main:
            shutil.rmtree(tmp, ignore_errors=True)
            save_model(
                model,
                self.tokenizer,
                tmp,
                {**self.info, "step": step, "dtype": export},
                state_dict=weights,
            )
            write_json(tmp / "settings.json", self.settings)
        barrier(pg)
        save_trainer_state(model, opt, tmp / STATE_DIR, pg.world)
        hashes = written_state_hashes(tmp, pg)
        if pg.main:
            torch.save({"generator": generator.get_state(), "step": step, "state_sha256": hashes}, tmp / STATE_FILE)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            keep_states(self.out_dir, self.training.get("keep_states"))
        barrier(pg)
        return final
