"""Tokenisation into token rows (``token_rows``) by parallel, resumable jobs.

A source's documents are cut into chunks of ``chunk_docs`` in order. Shard k of n tokenises the
chunks k, k + n, k + 2n, ... with a pool of worker processes (every shard reads the whole source
and tokenises its share; reading is cheap beside tokenising) and writes them in parts of about
``part_tokens`` tokens into a work folder. After each part a progress file records it, so a shard
killed at its time limit or with its node continues from its last part when rerun, and writes the
same bytes as one never stopped (part boundaries depend on the tokens only). A shard of a source
with a token budget stops once it holds its share of the budget plus ``SHARD_SLACK``.

The merge lays the shards' chunks back in source order and cuts the rows at the budget, so the
rows are the same for any number of shards; the rare chunk the budget needs past where a shard
stopped (shards hold slightly different token counts) is tokenised by the merge itself. Its token
files are hard links to the shards' parts (no copy of a 200 GB stream); a source that runs dry
before its budget fails here, naming the source, its token count and the budget, before any
training starts.

Hand-written rather than ``datasets.map``: a 50B-token stream is read from the hub in order, up
to its budget, and written as it goes; ``Dataset.map(num_proc=...)`` needs the whole data set
materialised first, an IterableDataset's map has no workers, and neither resumes.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..provenance import read_json, write_json
from .token_rows import chunk_tokens

CHUNK_DOCS = 256  # documents per tokenisation task, and the unit shards split the source by
PART_TOKENS = 1 << 26  # tokens per part (256 MB): what a killed shard can lose, about a minute of work
SHARD_SLACK = 0.02  # a budgeted shard's extra share: the merge tokenises what a short shard lacks

Documents = Callable[[], Iterable[dict]]  # a fresh pass over the source's documents, in order


@dataclass(frozen=True)
class RowsJob:
    """One token_rows folder's making: ``docs()`` (a fresh pass over the source, in order) tokenised
    with the tokenizer in ``tokenizer_dir`` into rows of ``seq_len`` tokens, ``packed`` or one document
    per row (padded with ``pad_id``), cut at ``budget_tokens`` (None: all of it). ``settings`` name the
    source and tokenizer (a shard resumed under other settings starts over); ``info`` (source,
    selection, ordered, origin, budget_key) goes into the index and names the source in errors;
    ``chunk_docs`` and ``part_tokens`` size the chunks and the files written (module docstring)."""

    docs: Documents
    tokenizer_dir: str | Path
    seq_len: int
    packed: bool
    settings: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    pad_id: int | None = None
    budget_tokens: int | None = None
    chunk_docs: int = CHUNK_DOCS
    part_tokens: int = PART_TOKENS

    @property
    def needed_tokens(self) -> int | None:
        return needed_tokens(self.budget_tokens, self.seq_len, self.packed)


_worker_tokenizer = None


def _load_tokenizer(path: str) -> None:
    from transformers import AutoTokenizer

    global _worker_tokenizer
    _worker_tokenizer = AutoTokenizer.from_pretrained(path)


def _tokenize(args):
    docs, seq_len, packed = args
    return chunk_tokens(docs, _worker_tokenizer, seq_len, packed)


def chunked(docs: Iterable[dict], chunk_docs: int) -> Iterator[list[dict]]:
    it = iter(docs)
    return iter(lambda: list(itertools.islice(it, chunk_docs)), [])


def _own_chunks(docs: Iterable[dict], shard: int, shards: int, chunk_docs: int, start: int):
    """(chunk number, documents) of this shard's chunks from chunk ``start`` on; the others'
    documents are read past without being kept."""
    it = iter(docs)
    for c in itertools.count():
        if c % shards == shard and c >= start:
            chunk = list(itertools.islice(it, chunk_docs))
            if not chunk:
                return
            yield c, chunk
        elif sum(1 for _ in itertools.islice(it, chunk_docs)) == 0:
            return


def tokenized_chunks(
    chunks: Iterator[tuple[int, list[dict]]], tokenizer_dir: str, seq_len: int, packed: bool, workers: int
):
    """(chunk number, tokens, rows) in chunk order, tokenised by ``workers`` processes (a bounded
    number of chunks in flight, so a stream is read only as far as it is consumed)."""
    if workers <= 1:
        _load_tokenizer(tokenizer_dir)
        for c, docs in chunks:
            yield (c, *_tokenize((docs, seq_len, packed)))
        return
    with ProcessPoolExecutor(workers, initializer=_load_tokenizer, initargs=(tokenizer_dir,)) as pool:

        def submit(item):
            return item[0], pool.submit(_tokenize, (item[1], seq_len, packed))

        pending = collections.deque(submit(item) for item in itertools.islice(chunks, 2 * workers))
        try:
            while pending:
                c, future = pending.popleft()
                nxt = next(chunks, None)
                if nxt is not None:
                    pending.append(submit(nxt))
                yield (c, *future.result())
        finally:  # a shard that stops at its budget leaves chunks in flight
            for _, future in pending:
                future.cancel()


# --- one shard ------------------------------------------------------------------------------------


def _part_name(k: int, kind: str) -> str:
    return f"part-{k:05d}-{kind}.npy"


def _save(path: Path, array: np.ndarray) -> None:
    """Write ``array`` durably under its final name (a temp file renamed), so a kill leaves either
    the whole file or none."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _start(work: Path, settings: dict) -> dict:
    """The shard's progress: resumed from ``work`` when it was written under the same settings
    (its unrecorded parts, left by a kill, removed), else a fresh start."""
    path = work / "progress.json"
    progress = read_json(path) if path.is_file() else None
    if progress is None or progress["settings"] != settings:
        if progress is not None:
            print(f"{work}: written under other settings; starting over")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        progress = {"settings": settings, "parts": [], "next_chunk": 0, "tokens": 0, "exhausted": False, "done": False}
        write_json(path, progress)
        return progress
    recorded = {_part_name(k, kind) for k in range(len(progress["parts"])) for kind in ("tokens", "chunks", "rows")}
    for f in work.iterdir():
        if f.name != "progress.json" and f.name not in recorded:
            f.unlink()
    if progress["parts"]:
        print(f"{work}: resuming after {len(progress['parts'])} parts, {progress['tokens']} tokens")
    return progress


class _Part:
    """Chunks tokenised since the last part was written."""

    def __init__(self):
        self.tokens, self.rows, self.chunks, self.size, self.row_count = [], [], [], 0, 0

    def add(self, c: int, tokens: np.ndarray, rows: np.ndarray | None) -> None:
        n_rows = 0 if rows is None else len(rows)
        self.chunks.append((c, self.size, len(tokens), self.row_count, n_rows))
        if rows is not None:  # starts within the chunk
            self.rows.append(rows)
        self.tokens.append(tokens)
        self.size += len(tokens)
        self.row_count += n_rows

    def write(self, work: Path, k: int, packed: bool) -> dict:
        _save(work / _part_name(k, "tokens"), np.concatenate(self.tokens).astype(np.uint32))
        _save(work / _part_name(k, "chunks"), np.array(self.chunks, dtype=np.int64).reshape(-1, 5))
        if not packed:
            _save(work / _part_name(k, "rows"), np.concatenate(self.rows).astype(np.int64).reshape(-1, 3))
        return {"tokens": self.size, "chunks": len(self.chunks), "rows": self.row_count}


def write_shard(
    job: RowsJob, work, *, shard: int = 0, shards: int = 1, stop_tokens: int | None = None, workers: int = 1
) -> dict:
    """Tokenise shard ``shard`` of ``shards`` of the job's documents into ``work``, resuming what an
    earlier attempt under the same settings (source, tokenizer) wrote there; stop after the chunk that
    reaches ``stop_tokens``, or at the end of the source. Returns the progress record."""
    work, seq_len, packed = Path(work), job.seq_len, job.packed
    settings = {
        **job.settings,
        "seq_len": seq_len,
        "packed": packed,
        "shard": shard,
        "shards": shards,
        "stop_tokens": stop_tokens,
        "chunk_docs": job.chunk_docs,
        "part_tokens": job.part_tokens,
    }
    progress = _start(work, settings)
    if progress["done"]:
        return progress
    own = _own_chunks(job.docs(), shard, shards, job.chunk_docs, progress["next_chunk"])
    part = _Part()

    def record(exhausted: bool = False, done: bool = False) -> None:
        nonlocal part
        if part.chunks:
            progress["parts"].append(part.write(work, len(progress["parts"]), packed))
            progress["tokens"] += part.size
            progress["next_chunk"] = part.chunks[-1][0] + 1
            part = _Part()
        progress.update(exhausted=exhausted, done=done)
        write_json(work / "progress.json", progress)

    for c, tokens, rows in tokenized_chunks(own, str(job.tokenizer_dir), seq_len, packed, workers):
        part.add(c, tokens, rows)
        if stop_tokens is not None and progress["tokens"] + part.size >= stop_tokens:
            record(done=True)
            return progress
        if part.size >= job.part_tokens:
            record()
    record(exhausted=True, done=True)
    return progress


def shard_stop_tokens(need: int | None, shards: int) -> int | None:
    """Where a shard of a source whose rows need ``need`` tokens stops: its share plus the slack."""
    if need is None:
        return None
    return need if shards == 1 else math.ceil(need * (1 + SHARD_SLACK) / shards)


# --- the merge ------------------------------------------------------------------------------------


class Chunk(NamedTuple):
    file: str  # token file, relative to its folder
    folder: Path
    start: int
    tokens: int
    rows: np.ndarray | None  # (start in the file, length, prompt length) per row; None when packed


def _shard_chunks(folder: Path, packed: bool) -> tuple[dict, Iterator[tuple[int, Chunk]]]:
    progress = read_json(folder / "progress.json")
    if not progress["done"]:
        raise ValueError(
            f"{folder}: shard {progress['settings']['shard']} of {progress['settings']['shards']} "
            "did not finish (its job stopped before the end of its share)"
        )

    def chunks():
        for k in range(len(progress["parts"])):
            rows = None if packed else np.load(folder / _part_name(k, "rows"))
            for c, start, n, row_start, n_rows in np.load(folder / _part_name(k, "chunks")).tolist():
                yield (
                    c,
                    Chunk(
                        _part_name(k, "tokens"),
                        folder,
                        start,
                        n,
                        None if packed else rows[row_start : row_start + n_rows],
                    ),
                )

    return progress, chunks()


class _TopUp:
    """Chunks a shard stopped short of, tokenised here from a fresh pass over the source."""

    def __init__(self, job: RowsJob, out: Path):
        self.job, self.out = job, out
        self._it, self._next, self.parts = None, 0, []

    def chunk(self, c: int) -> Chunk | None:
        if self._it is None:
            _load_tokenizer(str(self.job.tokenizer_dir))
            self._it = chunked(self.job.docs(), self.job.chunk_docs)
        docs = None
        while self._next <= c:
            docs = next(self._it, None)
            self._next += 1
            if docs is None:
                return None
        tokens, rows = chunk_tokens(docs, _worker_tokenizer, self.job.seq_len, self.job.packed)
        name = f"topup-{len(self.parts):05d}.npy"
        _save(self.out / name, tokens)
        self.parts.append(name)
        return Chunk(name, self.out, 0, len(tokens), rows)


def needed_tokens(budget_tokens: int | None, seq_len: int, packed: bool) -> int | None:
    """Tokens the rows of a budgeted source take: whole packed rows covering the budget."""
    if budget_tokens is None:
        return None
    return math.ceil(budget_tokens / seq_len) * seq_len if packed else budget_tokens


def _ordered_chunks(shards: list[tuple[dict, Iterator]], top_up: _TopUp) -> Iterator[Chunk]:
    """Every chunk in source order: shard c % n's next one, or tokenised here where that shard
    stopped before the source ended."""
    heads = [next(it, None) for _, it in shards]
    for c in itertools.count():
        k = c % len(shards)
        if heads[k] is not None:
            if heads[k][0] != c:
                raise ValueError(f"shard {k} holds chunk {heads[k][0]} where chunk {c} belongs: its parts are damaged")
            chunk, heads[k] = heads[k][1], next(shards[k][1], None)
        elif shards[k][0]["exhausted"]:
            return
        else:
            chunk = top_up.chunk(c)
            if chunk is None:
                return
        yield chunk


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copyfile(src, dst)


def _row_table(chunks, packed: bool, need: int | None) -> tuple[dict, list, int]:
    """The index's files ((folder, name) -> number), its table (packed: file, start, tokens per segment;
    else file, start, length, prompt per row) and the tokens it holds: ``chunks`` in order until ``need``
    tokens (None: all)."""
    files: dict[tuple[Path, str], int] = {}
    table, tokens = [], 0
    for chunk in chunks:
        f = files.setdefault((chunk.folder, chunk.file), len(files))
        if packed:
            take = chunk.tokens if need is None else min(chunk.tokens, need - tokens)
            table.append((f, chunk.start, take))
            tokens += take
        else:
            for start, length, prompt in chunk.rows.tolist():
                if need is not None and tokens >= need:
                    break
                table.append((f, chunk.start + start, length, prompt))
                tokens += length
        if need is not None and tokens >= need:
            break
    return files, table, tokens


def merge_shards(job: RowsJob, shard_dirs: list, out_dir) -> dict:
    """The token-rows folder ``out_dir`` (replaced whole) from its shards' work folders, in source
    order, cut at the job's budget (packed: the whole rows covering it); a chunk a shard stopped short
    of is tokenised here from a fresh pass over the source."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seq_len, packed, info, budget_tokens = job.seq_len, job.packed, job.info, job.budget_tokens
    need = job.needed_tokens
    top_up = _TopUp(job, tmp)
    chunks = _ordered_chunks([_shard_chunks(Path(d), packed) for d in shard_dirs], top_up)
    files, table, tokens = _row_table(chunks, packed, need)
    if need is not None and tokens < need:
        raise ValueError(
            f"the {info['source']} ({info.get('origin', 'its source')}) holds only {tokens} tokens, fewer "
            f"than its budget of {budget_tokens} ({info.get('budget_key', 'its token budget')}): "
            "lower the budget or name a larger source"
        )
    rows = (tokens // seq_len) if packed else len(table)
    if not rows:
        raise ValueError(
            f"no training rows for {info}: "
            + (
                f"{tokens} tokens, fewer than one row of {seq_len}"
                if packed
                else f"every document is longer than the sequence length ({seq_len}), or the corpus is empty"
            )
        )
    shard_of = {Path(d): k for k, d in enumerate(shard_dirs)}
    names = []
    for folder, name in files:  # in the order numbered: a shard's files linked in under their shard's prefix
        names.append(name if folder == tmp else f"shard{shard_of[folder]:03d}-{name}")
        if folder != tmp:
            _link(folder / name, tmp / names[-1])
    if packed:
        np.save(tmp / "segments.npy", np.array(table, dtype=np.int64).reshape(-1, 3))
        tokens = rows * seq_len  # a tail shorter than a row is not trained on
    else:
        np.save(tmp / "rows.npy", np.array(table, dtype=np.int64).reshape(-1, 4))
    index = {
        **info,
        "packed": packed,
        "seq_len": seq_len,
        "pad_id": job.pad_id,
        "rows": rows,
        "tokens": tokens,
        "budget_tokens": budget_tokens,
        "shards": len(shard_dirs),
        "topped_up_chunks": len(top_up.parts),
        "files": names,
    }
    write_json(tmp / "index.json", index)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return index


def write_token_rows(job: RowsJob, out_dir, workers: int = 1) -> dict:
    """One job's token rows: a single shard written (resumably) in ``<out_dir>.partial``, then merged."""
    work = Path(str(out_dir) + ".partial")
    write_shard(job, work, stop_tokens=job.needed_tokens, workers=workers)
    index = merge_shards(job, [work], out_dir)
    shutil.rmtree(work)
    return index
