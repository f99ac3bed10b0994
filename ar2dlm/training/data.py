"""Conversion micro-batches: rows (packed text, or one document per row with its prompt as block 0,
never masked; see ``ar2dlm.data.token_rows``) batched deterministically, so a resumed run sees
exactly the batches of an uninterrupted one and seeks to them directly.

A micro-batch is the same on every process: each reads the whole micro-batch's rows (ids only, a
few KB), draws the random masks of all of them and trains on its share (``MicroBatch.rows``), so
masks do not depend on the number of processes."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.diffusion import collate


class MicroBatch(NamedTuple):
    ids: torch.Tensor  # (B, T) every process's rows, right-padded
    valid: torch.Tensor
    prompt_lens: torch.Tensor
    rows: torch.Tensor  # the rows this process trains on
    world: int  # processes sharing the micro-batch
    index: int  # the micro-batch's number in the run: row r is sample index * len(ids) + r

    def to(self, device) -> MicroBatch:
        return MicroBatch(
            self.ids.to(device),
            self.valid.to(device),
            self.prompt_lens.to(device),
            self.rows.to(device),
            self.world,
            self.index,
        )

    def sample_ids(self) -> list[int]:
        """Run-wide indices of this process's rows."""
        return [self.index * len(self.ids) + int(r) for r in self.rows]

    def share(self, whole):
        """This process's rows of something computed for the whole micro-batch (a NoisedBatch)."""
        return whole.select(self.rows) if self.world > 1 else whole

    def whole_count(self, selected: torch.Tensor) -> torch.Tensor | None:
        """How many positions ``selected`` (of the whole micro-batch) marks: the normaliser of a
        process's share; None with one process, whose share is the whole."""
        return selected.sum() if self.world > 1 else None

    def local(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, valid, prompt_lens) of this process's rows."""
        return self.ids[self.rows], self.valid[self.rows], self.prompt_lens[self.rows]


class Batches:
    """Micro-batch ``index`` is a pure function of (seed, index): epochs are seeded permutations of
    the rows, or, ``ordered`` (a stream read once), the rows in order. ``rows``: any sequence of
    (ids, prompt length), e.g. memory-mapped :class:`~ar2dlm.data.token_rows.TokenRows`."""

    def __init__(
        self, rows, batch_size: int, seed: int, pad_id: int, ordered: bool = False, fill_id: int | None = None
    ):
        if not len(rows):
            raise ValueError(
                "no training rows: every document is longer than the sequence length, or the corpus is empty"
            )
        self.rows, self.batch_size, self.seed, self.pad_id, self.ordered = rows, batch_size, seed, pad_id, ordered
        self.fill_id = fill_id  # complete documents filled with it to the longest row (``collate``)
        self._perm_epoch, self._perm = None, None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm_epoch != epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.rows), generator=g), epoch
        return self._perm

    def whole(self, index: int):
        """(ids, valid, prompt_lens) of micro-batch ``index``: every process's rows."""
        n = len(self.rows)
        idx = range(index * self.batch_size, (index + 1) * self.batch_size)
        if self.ordered:
            if idx[-1] >= n:
                raise ValueError(f"micro-batch {index} needs row {idx[-1]} of a stream read once, which holds {n} rows")
            return collate([self.rows[i] for i in idx], self.pad_id, self.fill_id)
        return collate([self.rows[int(self._permutation(i // n)[i % n])] for i in idx], self.pad_id, self.fill_id)

    def __call__(self, index: int, rank: int = 0, world: int = 1) -> MicroBatch:
        """Micro-batch ``index`` with this process's rows marked: rank, rank + world, ..."""
        return share(self.whole(index), rank, world, index)

    def require(self, stop: int) -> None:
        """Fail, before a step is trained, when a stream read once holds fewer rows than micro-batches
        up to ``stop`` take (epochs of a file repeat it; a stream must not)."""
        need = stop * self.batch_size
        if self.ordered and need > len(self.rows):
            what = self.rows.describe() if hasattr(self.rows, "describe") else "the stream"
            raise ValueError(
                f"{what} holds {len(self.rows)} rows; the run's {stop} micro-batches of {self.batch_size} "
                f"rows need {need}: rebuild the rows with a larger token budget or train fewer steps"
            )

    def loader(self, start: int, stop: int, workers: int = 0):
        """Micro-batches ``start`` to ``stop`` - 1 through a DataLoader (``workers`` processes read
        ahead); a resumed run starts at its own index without reading what came before. A stream
        read once is checked to hold them all first (``require``)."""
        self.require(stop)
        return torch.utils.data.DataLoader(
            _Indexed(self),
            batch_size=None,
            sampler=range(start, stop),
            num_workers=workers,
            prefetch_factor=4 if workers else None,
        )


class PairBatches(Batches):
    """Micro-batches of preference pairs: ``rows`` holds (chosen, rejected) rows, each (ids, prompt
    length); micro-batch ``index`` lays out the chosen rows of ``batch_size`` pairs, then their
    rejected rows in the same order, so with ``batch_size`` divisible by the number of processes
    both rows of a pair fall to the same process (rows rank, rank + world, ...)."""

    def whole(self, index: int):
        n = len(self.rows)
        picks = [
            int(self._permutation(i // n)[i % n]) for i in range(index * self.batch_size, (index + 1) * self.batch_size)
        ]
        return collate([self.rows[p][0] for p in picks] + [self.rows[p][1] for p in picks], self.pad_id)


class _Indexed(torch.utils.data.Dataset):
    def __init__(self, batches: Batches):
        self.batches = batches

    def __getitem__(self, index: int):
        return self.batches.whole(index)


def share(whole, rank: int, world: int, index: int) -> MicroBatch:
    """A whole micro-batch (ids, valid, prompt_lens) with this process's rows marked."""
    return MicroBatch(*whole, torch.arange(rank, len(whole[0]), world), world, index)
