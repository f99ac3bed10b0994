"""Pre-tokenised training rows: the corpus cut to a run's sequence length exactly as the trainer
trains on it (one document per row, prompt = block 0; a long plain-text document split into
several rows), tokenised once by the ``token_rows`` rule instead of by every process of every run.

A folder holds fixed-width shards ``rows-<k>.npy`` (uint32 ids, right-padded to the sequence
length) with ``lengths-<k>.npy`` and ``prompt_lens-<k>.npy`` beside them, and ``index.json``
(rows per shard, tokens, sequence length, source, selection). :class:`TokenRows` memory-maps the
shards: row i is read in O(1) without loading the rest, so a resumed run seeks straight to its step.
Documents are tokenised in chunks by a pool of processes, in order.

Hand-written rather than ``datasets.map``: a 50B-token stream is read from the hub once, in order,
up to its budget, and written as it goes; ``Dataset.map(num_proc=...)`` needs the whole data set
materialised first (and an IterableDataset's map has no workers).
"""

from __future__ import annotations

import collections
import itertools
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..provenance import read_json, write_json
from .tokenization import encode_pair

SHARD_ROWS = 1 << 18  # rows per shard: 2 GB at 2048 uint32 tokens
CHUNK_DOCS = 256  # documents per tokenisation task

_worker_tokenizer = None


def document_rows(docs: Iterable[dict], tokenizer, seq_len: int) -> list[tuple[list[int], int]]:
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


def _load_tokenizer(path: str) -> None:
    from transformers import AutoTokenizer

    global _worker_tokenizer
    _worker_tokenizer = AutoTokenizer.from_pretrained(path)


def _chunk_rows(args) -> list[tuple[list[int], int]]:
    docs, seq_len = args
    return document_rows(docs, _worker_tokenizer, seq_len)


def _ordered_rows(docs: Iterator[dict], tokenizer_dir: str, seq_len: int, workers: int):
    """Rows of ``docs`` in document order, tokenised in chunks by ``workers`` processes (a bounded
    number of chunks in flight, so an endless stream is read only as far as it is consumed)."""
    chunks = iter(lambda: list(itertools.islice(docs, CHUNK_DOCS)), [])
    if workers <= 1:
        _load_tokenizer(tokenizer_dir)
        for chunk in chunks:
            yield from _chunk_rows((chunk, seq_len))
        return
    with ProcessPoolExecutor(workers, initializer=_load_tokenizer, initargs=(tokenizer_dir,)) as pool:
        pending = collections.deque(pool.submit(_chunk_rows, (c, seq_len)) for c in itertools.islice(chunks, 2 * workers))
        while pending:
            rows = pending.popleft().result()
            nxt = next(chunks, None)
            if nxt is not None:
                pending.append(pool.submit(_chunk_rows, (nxt, seq_len)))
            yield from rows


def write_token_rows(docs: Iterable[dict], tokenizer_dir, seq_len: int, pad_id: int, out_dir, *, info: dict,
                     workers: int = 1, budget_tokens: int | None = None, shard_rows: int = SHARD_ROWS) -> dict:
    """Tokenise ``docs`` into rows of at most ``seq_len`` tokens and write them as shards in
    ``out_dir`` (replaced whole: written beside it, then moved), stopping at the row that reaches
    ``budget_tokens`` tokens. ``info`` (source, selection, ordered) goes into the index."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shards, tokens = [], 0
    rows = _ordered_rows(iter(docs), str(tokenizer_dir), seq_len, workers)
    while budget_tokens is None or tokens < budget_tokens:
        batch, shard_tokens = [], 0
        for row in rows:  # up to a shard, or the budget
            batch.append(row)
            shard_tokens += len(row[0])
            if len(batch) == shard_rows or (budget_tokens is not None and tokens + shard_tokens >= budget_tokens):
                break
        if not batch:
            break
        ids = np.full((len(batch), seq_len), pad_id, dtype=np.uint32)
        lengths = np.array([len(r) for r, _ in batch], dtype=np.int32)
        for i, (r, _) in enumerate(batch):
            ids[i, :len(r)] = r
        k = len(shards)
        np.save(tmp / f"rows-{k:05d}.npy", ids)
        np.save(tmp / f"lengths-{k:05d}.npy", lengths)
        np.save(tmp / f"prompt_lens-{k:05d}.npy", np.array([p for _, p in batch], dtype=np.int32))
        shards.append(len(batch))
        tokens += int(lengths.sum())
    if not shards:
        raise ValueError(f"no training rows for {info}: every document is longer than the sequence length "
                         f"({seq_len}), or the corpus is empty")
    index = {**info, "seq_len": seq_len, "pad_id": pad_id, "rows": sum(shards), "shards": shards, "tokens": tokens}
    write_json(tmp / "index.json", index)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return index


class TokenRows:
    """The rows of a token-rows folder, memory-mapped: ``rows[i]`` is (ids, prompt length)."""

    def __init__(self, directory):
        directory = Path(directory)
        self.index = read_json(directory / "index.json")
        n = len(self.index["shards"])
        self._ids = [np.load(directory / f"rows-{k:05d}.npy", mmap_mode="r") for k in range(n)]
        self._lengths = [np.load(directory / f"lengths-{k:05d}.npy", mmap_mode="r") for k in range(n)]
        self._prompts = [np.load(directory / f"prompt_lens-{k:05d}.npy", mmap_mode="r") for k in range(n)]
        self._starts = np.cumsum([0] + self.index["shards"])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        j = i - int(self._starts[k])
        return self._ids[k][j, :self._lengths[k][j]].astype(np.int64).tolist(), int(self._prompts[k][j])
