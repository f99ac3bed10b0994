"""Pretraining corpora and the seeded token-budget subsampler.

A document is ``{"prompt": str, "completion": str, "source": str}``; plain text has an empty
prompt. Token counts use :func:`ar2dlm.data.tokenization.encode_pair` (prompt and completion encoded
separately, end-of-text appended), so a budget means the tokens a trainer will actually see.

The subset and the stream of a corpus are prefixes of one seeded shuffle of the same source, so
the small subset is contained in the larger stream (REPR-ALIGN's data study).
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .tokenization import encode_pair

# Distillation prompt sets drawn from the synthetic corpus: the document sources each one keeps.
PROMPT_SOURCES = {"all": ("code", "math"), "code": ("code",), "math": ("math",)}


def prompt_documents(docs: list[dict], prompts: str) -> list[dict]:
    """The synthetic corpus's documents of prompt set ``prompts`` (a key of PROMPT_SOURCES)."""
    return [d for d in docs if d.get("source") in PROMPT_SOURCES[prompts]]


def select_documents(docs, selection: str):
    """The documents a selection keeps: ``documents`` and ``document_rows`` (all, packed or one per
    row: ``token_rows.packs``; an iterable stays lazy), or ``prompts_<name>``, the documents of
    prompt source <name> (PROMPT_SOURCES)."""
    if selection in ("documents", "document_rows"):
        return docs
    return prompt_documents(list(docs), selection[len("prompts_") :])


def suite_documents(code_train: list[dict], math_train: list[dict]) -> list[dict]:
    docs = [{"prompt": t["prompt"], "completion": t["canonical_solution"], "source": "code"} for t in code_train]
    docs += [{"prompt": p["prompt"], "completion": p["completion"], "source": "math"} for p in math_train]
    return docs


def stdlib_documents(n_files: int, seed: int, max_chars: int = 4000) -> list[dict]:
    """Real Python source text from this interpreter's standard library (offline), in chunks."""
    if n_files <= 0:
        return []
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 2000)
    rng = random.Random(f"{seed}-stdlib")
    docs = []
    for path in rng.sample(files, min(n_files, len(files))):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs += [
            {"prompt": "", "completion": text[i : i + max_chars], "source": f"stdlib/{path.name}"}
            for i in range(0, len(text), max_chars)
        ]
    return docs


def hub_documents(spec: dict, seed: int) -> Iterator[dict]:
    """Stream documents from a ``datasets`` source (a hub data set read from its cached snapshot,
    or a builder such as ``json`` with local ``data_files``), shuffled with a seeded buffer. Text
    comes from ``text_field``, or from ``prompt_field`` + ``completion_field`` for SFT-style data
    (prompt tokens are then never masked)."""
    from ..core.hub import load_hub_dataset

    ds = load_hub_dataset(
        spec["path"],
        spec.get("name"),
        data_files=spec.get("data_files"),
        split=spec.get("split", "train"),
        streaming=True,
    )
    ds = ds.shuffle(seed=seed, buffer_size=spec.get("shuffle_buffer", 10_000))
    for row in ds:
        if spec.get("text_field"):
            yield {"prompt": "", "completion": str(row[spec["text_field"]]), "source": spec["path"]}
        else:
            completion = row[spec["completion_field"]] if spec.get("completion_field") else ""
            yield {"prompt": str(row[spec["prompt_field"]]), "completion": str(completion), "source": spec["path"]}


def take_tokens(docs: Iterable[dict], budget: int, count: Callable[[dict], int], what: str) -> tuple[list[dict], int]:
    """Take documents in order until ``budget`` tokens are reached; fail if the source runs dry."""
    out, total = [], 0
    for doc in docs:
        if total >= budget:
            break
        out.append(doc)
        total += count(doc)
    if total < budget:
        raise ValueError(f"{what}: the source holds only {total} tokens, fewer than the budget of {budget}")
    return out, total


def token_counter(tokenizer) -> Callable[[dict], int]:
    def count(doc: dict) -> int:
        p, c = encode_pair(tokenizer, doc["prompt"], doc["completion"])
        return len(p) + len(c)

    return count


def shuffled(docs: list[dict], seed: int) -> list[dict]:
    docs = list(docs)
    random.Random(f"{seed}-corpus").shuffle(docs)
    return docs
