"""Conversion data: one document per row (prompt = block 0, never masked; completion = response),
batched deterministically so a resumed run sees exactly the batches of an uninterrupted one.

A micro-batch is the same on every process: each process draws the random masks of all its rows
and trains on its share (``MicroBatch.rows``), so masks do not depend on the number of processes."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.diffusion import collate
from ..data.tokenization import encode_pair


def document_rows(docs: list[dict], tokenizer, seq_len: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per document, cut to ``seq_len``. Long plain-text documents
    (no prompt) are split into several rows; a prompt that fills the row leaves nothing to learn
    and is dropped."""
    rows = []
    for d in docs:
        p, c = encode_pair(tokenizer, d["prompt"], d["completion"])
        if not p:
            rows += [(c[i:i + seq_len], 0) for i in range(0, len(c), seq_len) if len(c[i:i + seq_len]) > 1]
        elif len(p) < seq_len:
            rows.append(((p + c)[:seq_len], len(p)))
    return rows


class MicroBatch(NamedTuple):
    ids: torch.Tensor  # (B, T) every process's rows, right-padded
    valid: torch.Tensor
    prompt_lens: torch.Tensor
    rows: torch.Tensor  # the rows this process trains on
    world: int  # processes sharing the micro-batch
    index: int  # the micro-batch's number in the run: row r is sample index * len(ids) + r

    def to(self, device) -> "MicroBatch":
        return MicroBatch(self.ids.to(device), self.valid.to(device), self.prompt_lens.to(device),
                          self.rows.to(device), self.world, self.index)

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


def micro_batch(rows: list[tuple[list[int], int]], pad_id: int, rank: int, world: int, index: int) -> MicroBatch:
    """Rows rank, rank + world, ... of micro-batch number ``index`` are this process's."""
    return MicroBatch(*collate(rows, pad_id), torch.arange(rank, len(rows), world), world, index)


class Batches:
    """Batch ``step`` is a pure function of (seed, step): epochs are seeded permutations."""

    def __init__(self, rows, batch_size: int, seed: int, pad_id: int):
        if not rows:
            raise ValueError("no training rows: every document is longer than the sequence length, or the corpus is empty")
        self.rows, self.batch_size, self.seed, self.pad_id = rows, batch_size, seed, pad_id
        self._perm_epoch, self._perm = None, None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm_epoch != epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.rows), generator=g), epoch
        return self._perm

    def __call__(self, step: int, rank: int = 0, world: int = 1) -> MicroBatch:
        n = len(self.rows)
        idx = [step * self.batch_size + j for j in range(self.batch_size)]
        picked = [self.rows[int(self._permutation(i // n)[i % n])] for i in idx]
        return micro_batch(picked, self.pad_id, rank, world, step)


class StreamBatches:
    """Batches read in order from a corpus that is never written out (the paper's 50B-token stream):
    documents come from the manifest's data set with its seeded shuffle, up to its token budget.
    Batch ``step`` must be asked in order; a resumed run skips the rows of earlier steps."""

    def __init__(self, manifest: dict, tokenizer, seq_len: int, batch_size: int, pad_id: int):
        from ..data.corpus import hub_documents

        spec = {k[len("corpus_"):]: v for k, v in manifest.items() if k.startswith("corpus_") and k != "corpus_source"}
        self.budget = manifest["stream"]["budget_tokens"]
        self.docs = hub_documents(spec, manifest["seed"])
        self.tokenizer, self.seq_len, self.batch_size, self.pad_id = tokenizer, seq_len, batch_size, pad_id
        self.next_step, self.tokens, self.pending = 0, 0, []

    def _rows(self, n: int):
        while len(self.pending) < n:
            if self.tokens >= self.budget:
                raise ValueError(f"the stream's budget of {self.budget} tokens is used up")
            new = document_rows([next(self.docs)], self.tokenizer, self.seq_len)
            self.tokens += sum(len(r) for r, _ in new)
            self.pending += new
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def __call__(self, step: int, rank: int = 0, world: int = 1) -> MicroBatch:
        while self.next_step < step:  # skip what earlier steps consumed (resume)
            self._rows(self.batch_size)
            self.next_step += 1
        if step != self.next_step:
            raise ValueError(f"stream batches are read in order: asked for step {step} after {self.next_step - 1}")
        self.next_step += 1
        return micro_batch(self._rows(self.batch_size), self.pad_id, rank, world, step)
