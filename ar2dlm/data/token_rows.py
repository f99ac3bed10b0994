"""Pre-tokenised training rows: the corpus cut to a run's sequence length exactly as the trainer
trains on it, tokenised once by the ``token_rows`` rules (``token_shards``) instead of by every
process of every run. Two layouts, by what the run's objective reads of a document (``packs``):

- packed (a corpus cut's documents, pretraining-style text): every document's tokens end to end,
  each ending with end-of-text, cut into rows of exactly ``seq_len`` tokens. No padding, so a
  token budget and a FLOP count mean tokens trained on; every row's prompt length is 0 (the
  prompt of a document that has one is trained on like the rest of it);
- document rows (a run with ``training.rows: documents``, a distillation run's prompts, a prompt set): one
  document per row, prompt = block 0, never masked, the completion's blocks starting at its first
  token (the layout a model is evaluated in); a long plain-text document split into several rows.

A folder holds flat uint32 token files and ``index.json`` (source, selection, layout, rows,
tokens, the token files); ``segments.npy`` (packed: file, start, length of each run of tokens, in
order) or ``rows.npy`` (document rows: file, start, length, prompt length of each row).
:class:`TokenRows` memory-maps the token files: row i is read in O(1) without loading the rest,
so a resumed run seeks straight to its step.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..provenance import read_json
from .tokenization import encode_pair

PACKED_SOURCES = ("subset", "stream")


def packs(source: str, selection: str) -> bool:
    """Whether the rows of (source, selection) are packed: all documents of a corpus cut
    (``documents``). A run with ``training.rows: documents`` (``document_rows``), a distillation run's
    prompts and a prompt set keep one document per row (the objective reads each row's prompt:
    never masked, rollouts start from it, blocks start at the completion)."""
    return source in PACKED_SOURCES and selection == "documents"


def row_layout(run: dict) -> str:
    """``training.rows`` of a resolved run: ``packed`` (the default) or ``documents``."""
    return run["training"].get("rows", "packed")


def run_packs(run: dict) -> bool:
    """Whether a conversion run trains on packed rows: ``training.rows: packed`` (the default) and
    not distillation, whose rows start with a prompt (the choice ``packs`` makes from the run's
    token_rows folder)."""
    return run.get("distill") is None and row_layout(run) == "packed"


def document_rows(docs: Iterable[dict], tokenizer, seq_len: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per document, cut to ``seq_len``. Long plain-text documents
    (no prompt) are split into several rows; a prompt that fills the row leaves nothing to learn
    and is dropped."""
    rows = []
    for d in docs:
        p, c = encode_pair(tokenizer, d["prompt"], d["completion"])
        if not p:
            rows += [(c[i : i + seq_len], 0) for i in range(0, len(c), seq_len) if len(c[i : i + seq_len]) > 1]
        elif len(p) < seq_len:
            rows.append(((p + c)[:seq_len], len(p)))
    return rows


def document_tokens(docs: Iterable[dict], tokenizer) -> list[int]:
    """The documents' tokens end to end, each ending with end-of-text (``encode_pair``)."""
    out: list[int] = []
    for d in docs:
        p, c = encode_pair(tokenizer, d["prompt"], d["completion"])
        out += p + c
    return out


def packed_rows(tokens: list[int], seq_len: int) -> list[tuple[list[int], int]]:
    """Rows of exactly ``seq_len`` tokens cut from a token stream in order (a tail shorter than a
    row is left out), each with prompt length 0."""
    return [(tokens[i : i + seq_len], 0) for i in range(0, len(tokens) - seq_len + 1, seq_len)]


def corpus_rows(docs: Iterable[dict], tokenizer, seq_len: int, packed: bool) -> list[tuple[list[int], int]]:
    """In memory, the rows a token-rows folder of ``docs`` holds."""
    return packed_rows(document_tokens(docs, tokenizer), seq_len) if packed else document_rows(docs, tokenizer, seq_len)


def chunk_tokens(docs: list[dict], tokenizer, seq_len: int, packed: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """One chunk of documents as a flat uint32 token array and, for document rows, its rows
    (start in the array, length, prompt length; None when packed)."""
    if packed:
        return np.asarray(document_tokens(docs, tokenizer), dtype=np.uint32), None
    rows = document_rows(docs, tokenizer, seq_len)
    lengths = np.array([len(r) for r, _ in rows], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    table = np.stack([starts, lengths, np.array([p for _, p in rows], dtype=np.int64)], axis=1).reshape(-1, 3)
    flat = np.fromiter((t for r, _ in rows for t in r), dtype=np.uint32, count=int(lengths.sum()))
    return flat, table


class TokenRows:
    """The rows of a token-rows folder, memory-mapped: ``rows[i]`` is (ids, prompt length)."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.index = read_json(self.directory / "index.json")
        if "packed" not in self.index:
            raise ValueError(
                f"{self.directory} holds token rows in an older layout (padded shards): delete it and "
                "rerun its token_rows job"
            )
        self.seq_len = self.index["seq_len"]
        self._maps: dict[int, np.ndarray] = {}
        if self.index["packed"]:
            self._segments = np.load(self.directory / "segments.npy")
            self._starts = np.concatenate([[0], np.cumsum(self._segments[:, 2])])
        else:
            self._rows = np.load(self.directory / "rows.npy")

    def _file(self, k: int) -> np.ndarray:
        if k not in self._maps:  # opened on first use: a stream has hundreds of files
            self._maps[k] = np.load(self.directory / self.index["files"][k], mmap_mode="r")
        return self._maps[k]

    def __len__(self) -> int:
        return int(self.index["rows"])

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        if not self.index["packed"]:
            f, start, length, prompt = (int(v) for v in self._rows[i])
            return self._file(f)[start : start + length].astype(np.int64).tolist(), prompt
        lo, hi = i * self.seq_len, (i + 1) * self.seq_len
        k = int(np.searchsorted(self._starts, lo, side="right") - 1)
        out: list[int] = []
        while lo < hi:  # a row may span the end of one segment and the start of the next
            f, start, length = (int(v) for v in self._segments[k])
            offset = lo - int(self._starts[k])
            take = min(hi - lo, length - offset)
            out += self._file(f)[start + offset : start + offset + take].astype(np.int64).tolist()
            lo, k = lo + take, k + 1
        return out, 0

    def describe(self) -> str:
        """The rows' source, for messages: e.g. ``stream (documents, packed rows of 2048 tokens)``."""
        i = self.index
        layout = "packed rows" if i["packed"] else "document rows"
        return f"{i['source']} ({i['selection']}, {layout} of {i['seq_len']} tokens, {self.directory})"
