"""The data stage: each function builds one set of files from the config, atomically."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ..provenance import library_versions, read_json, read_jsonl, write_json, write_jsonl
from .code_suite import generate_code_suite
from .corpus import hub_documents, shuffled, stdlib_documents, suite_documents, take_tokens, token_counter
from .math_suite import generate_math_suite
from .preferences import make_preferences
from .token_shards import RowsJob
from .tokenization import load_pretrained_tokenizer, train_bpe_tokenizer


def build_suites(data_cfg: dict, out: dict) -> dict:
    """The code and maths suites' train, eval and valid splits, written to ``out[f"{domain}_{split}"]``."""
    seed, c, m = data_cfg["seed"], data_cfg["code_suite"], data_cfg["math_suite"]
    splits = {
        "code": generate_code_suite(c["n_train"], c["n_eval"], c["heldout_fraction"], seed, c["n_valid"]),
        "math": generate_math_suite(m["n_train"], m["n_eval"], seed, m["n_valid"]),
    }
    for domain, rows in splits.items():
        for split, part in zip(("train", "eval", "valid"), rows):
            write_jsonl(out[f"{domain}_{split}"], part)
    return {domain: [len(part) for part in rows] for domain, rows in splits.items()}


def _message_text(value) -> str:
    """UltraFeedback-style fields hold a chat (list of messages): keep the last assistant turn."""
    if isinstance(value, list):
        turns = [m for m in value if m.get("role") == "assistant"] or value
        return str(turns[-1]["content"])
    return str(value)


def hub_preferences(spec: dict, split: str, n: int, seed: int, domain: str, skip: int = 0) -> list[dict]:
    """``n`` pairs of a hub preference set's split, in one seeded shuffle, after its first ``skip``
    (a set with one split: the held-out pairs are the shuffle's first, the training pairs the next)."""
    from ..core.hub import load_hub_dataset

    ds = load_hub_dataset(
        spec["path"], spec.get("name"), data_files=spec.get("data_files"), split=spec[f"{split}_split"], streaming=True
    )
    ds = ds.shuffle(seed=seed, buffer_size=spec.get("shuffle_buffer", 10_000)).skip(skip)
    rows = []
    for row in ds:
        if len(rows) == n:
            break
        rows.append(
            {
                "domain": domain,
                "source_id": str(row.get("prompt_id", len(rows))),
                "prompt": _message_text(row[spec["prompt_field"]]),
                "chosen": _message_text(row[spec["chosen_field"]]),
                "rejected": _message_text(row[spec["rejected_field"]]),
            }
        )
    if len(rows) < n:
        raise ValueError(
            f"data.preferences.n_{split}={n} but {spec['path']} split {spec[f'{split}_split']} "
            f"holds only {len(rows)} rows" + (f" after the {skip} held out" if skip else "")
        )
    return rows


def build_preferences(data_cfg: dict, domain: str, suite_train, suite_eval, out_train, out_eval) -> None:
    prefs, seed = data_cfg["preferences"], data_cfg["seed"]
    spec = prefs["domains"][domain]
    for split, src, out in (("train", suite_train, out_train), ("eval", suite_eval, out_eval)):
        n = spec.get(f"n_{split}", prefs[f"n_{split}"])
        if spec["source"] == "synthetic":
            rows = make_preferences(domain, read_jsonl(src), n, seed, split)
        else:  # one split for both: the training pairs start after the held-out ones (disjoint)
            one_split = split == "train" and spec["train_split"] == spec["eval_split"]
            skip = spec.get("n_eval", prefs["n_eval"]) if one_split else 0
            rows = hub_preferences(spec, split, n, seed, domain, skip=skip)
        write_jsonl(out, rows)


def build_tokenizer(data_cfg: dict, code_train, math_train, out_dir) -> int:
    tcfg = data_cfg["tokenizer"]
    if tcfg["source"] == "pretrained":
        tok = load_pretrained_tokenizer(tcfg["path"], out_dir)
    else:
        docs = suite_documents(read_jsonl(code_train), read_jsonl(math_train))
        docs += stdlib_documents(data_cfg["corpus"]["stdlib_files"], data_cfg["seed"])
        texts = (d["prompt"] + d["completion"] for d in docs)
        tok = train_bpe_tokenizer(texts, tcfg["vocab_size"], out_dir)
    return len(tok)


class CorpusFiles(NamedTuple):
    """Where a corpus is written: its manifest, the seeded subset, and the stream (None: the stream
    is read from the source at training time)."""

    manifest: str | Path
    subset: str | Path
    stream: str | Path | None = None


def build_corpus(data_cfg: dict, tokenizer_dir, code_train, math_train, out: CorpusFiles) -> dict:
    """Write the seeded subset (and the stream, if materialised) and a manifest describing both."""
    from transformers import AutoTokenizer

    manifest, subset, stream = out

    cfg, seed = data_cfg["corpus"], data_cfg["seed"]
    count = token_counter(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    if cfg["source"] == "synthetic":
        docs = suite_documents(read_jsonl(code_train), read_jsonl(math_train))
        docs += stdlib_documents(cfg["stdlib_files"], seed)
        ordered = shuffled(docs, seed)
        source = {"source": "synthetic", "documents": len(docs)}
    else:
        ordered = hub_documents(cfg["hub"], seed)
        source = {"source": "hub", **cfg["hub"]}
    if stream is not None:
        ordered = list(ordered) if not isinstance(ordered, list) else ordered
        stream_docs, stream_tokens = take_tokens(ordered, cfg["stream_tokens"], count, "data.corpus.stream_tokens")
        write_jsonl(stream, stream_docs)
        subset_docs, subset_tokens = take_tokens(stream_docs, cfg["subset_tokens"], count, "data.corpus.subset_tokens")
    else:
        subset_docs, subset_tokens = take_tokens(ordered, cfg["subset_tokens"], count, "data.corpus.subset_tokens")
        stream_tokens = None
    write_jsonl(subset, subset_docs)
    info = {
        "seed": seed,
        **{"corpus_" + k: v for k, v in source.items()},
        "subset": {"path": str(Path(subset).name), "documents": len(subset_docs), "tokens": subset_tokens},
        "stream": (
            {"path": str(Path(stream).name), "documents": len(stream_docs), "tokens": stream_tokens}
            if stream is not None
            else {
                "path": None,
                "budget_tokens": cfg["stream_tokens"],
                "note": "read from the source at training time with the same seeded shuffle",
            }
        ),
        "versions": library_versions(),
    }
    write_json(manifest, info)
    return info


def build_prompt_set(name: str, spec: dict, seed: int, out) -> int:
    """Distillation prompts (and completions, where the data set has them) from a ``datasets`` source."""
    docs = hub_documents({**spec, "text_field": None, "completion_field": spec.get("completion_field") or None}, seed)
    rows = []
    for doc in docs:
        if len(rows) == spec["n"]:
            break
        rows.append({**doc, "source": name})
    if len(rows) < spec["n"]:
        raise ValueError(f"data.prompt_sets.{name}.n={spec['n']} but {spec['path']} holds only {len(rows)} rows")
    return write_jsonl(out, rows)


def _jsonl_documents(path) -> Iterator[dict]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _file_stamp(path) -> list:
    st = Path(path).stat()
    return [st.st_size, st.st_mtime_ns]


def rows_job(source_path, tokenizer_dir, source: str, selection: str, seq_len: int) -> RowsJob:
    """The token_rows job of ``source`` (its file or a stream's manifest): the documents ``selection``
    keeps, in rows of ``seq_len`` tokens. A stream that is not written out (its manifest) is read from its
    source up to its token budget and trained on once, in order; written-out files are trained on in
    seeded epochs."""
    from .corpus import select_documents
    from .token_rows import packs

    if str(source_path).endswith(".json"):
        manifest = read_json(source_path)
        spec = {k[len("corpus_") :]: v for k, v in manifest.items() if k.startswith("corpus_") and k != "corpus_source"}

        def docs():
            return hub_documents(spec, manifest["seed"])

        budget, origin = manifest["stream"]["budget_tokens"], f"{spec['path']}, split {spec.get('split', 'train')}"
    else:
        docs, budget, origin = (lambda: _jsonl_documents(source_path)), None, str(source_path)
    tok = Path(tokenizer_dir)
    settings = {
        "source": str(source_path),
        "source_stamp": _file_stamp(source_path),
        "selection": selection,
        "tokenizer": {f.name: _file_stamp(f) for f in sorted(tok.iterdir()) if f.is_file()},
    }
    info = {
        "source": source,
        "selection": selection,
        "ordered": budget is not None,
        "origin": origin,
        "budget_key": "data.corpus.stream_tokens",
    }
    from transformers import AutoTokenizer

    return RowsJob(
        docs=lambda: select_documents(docs(), selection),
        tokenizer_dir=tokenizer_dir,
        seq_len=seq_len,
        packed=packs(source, selection),
        settings=settings,
        info=info,
        pad_id=AutoTokenizer.from_pretrained(str(tokenizer_dir)).pad_token_id,
        budget_tokens=budget,
    )


def _write_token_shard(job: RowsJob, out_dir, shard: int, shards: int, workers: int):
    """Shard ``shard`` of ``shards`` of a token_rows job, written resumably in ``<out_dir>.partial``
    and moved to ``out_dir`` when done."""
    from .token_shards import shard_stop_tokens, write_shard

    work = Path(str(out_dir) + ".partial")
    stop = shard_stop_tokens(job.needed_tokens, shards)
    progress = write_shard(job, work, shard=shard, shards=shards, workers=workers, stop_tokens=stop)
    shutil.rmtree(out_dir, ignore_errors=True)
    work.rename(out_dir)
    return {k: progress[k] for k in ("tokens", "next_chunk", "exhausted")} | {"parts": len(progress["parts"])}


def build_token_rows(
    job: RowsJob,
    out_dir,
    *,
    workers: int = 1,
    shard_dirs: list | None = None,
    shard: int | None = None,
    shards: int | None = None,
) -> dict:
    """Tokenise a corpus cut, prompt set or stream into rows (``token_rows``; ``rows_job`` describes
    it): merge the shards ``shard_dirs`` that ``token_rows_shard`` jobs wrote, or, without them,
    tokenise here with ``workers`` processes (resumably too). With ``shard``: only shard ``shard``
    of ``shards``, a ``token_rows_shard`` job's part, written resumably in ``<out_dir>.partial`` and
    moved to ``out_dir`` when done."""
    from .token_shards import merge_shards, write_token_rows

    if shard is not None:
        return _write_token_shard(job, out_dir, shard, shards, workers)
    if shard_dirs:
        return merge_shards(job, shard_dirs, out_dir)
    return write_token_rows(job, out_dir, workers)
