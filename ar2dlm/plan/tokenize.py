"""The token_rows jobs of a config: how many parallel shard jobs tokenise each source, with how
many worker processes, how much memory and how long, from the source's token budget.

A source of T tokens is split into the fewest shards that tokenise it within ``TARGET_HOURS`` at
``TOKENS_PER_SECOND`` per worker process, ``WORKERS`` processes per job (all shards run at once:
the wall time is one shard's). The rate is the low end of what the Qwen3 tokenizer did per
process on code and web text here (0.16-0.5M tokens/s; ``benchmarks/tokenize_speed.py`` measures
it on a machine), so the plan holds on a slower CPU; the target is half the 12-hour goal for the
50B-token stream, leaving the other half for a queue or a rate below the plan. A job's runtime
limit is twice its planned time plus an hour (each shard also reads the whole source past the
chunks of the others); a job stopped at its limit resumes from its last part when rerun.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .one_gpu import PROMPT_TOKENS

if TYPE_CHECKING:
    from ..pipeline.resolved import Resolved

TOKENS_PER_SECOND = 160_000  # per worker process (see the module's docstring)
TARGET_HOURS = 6.0
WORKERS = 8  # worker processes (CPUs) of a job on a cluster
LOCAL_WORKERS = 4  # without a cluster: a laptop's or CI machine's cores, shared with other jobs
JOB_MEMORY_MB = 4000  # the reading process: a hub stream's shuffle buffer, a part being written
WORKER_MEMORY_MB = 1500  # a worker: the tokenizer and a chunk in flight


@dataclass(frozen=True)
class TokenizePlan:
    source: str
    selection: str
    seq_len: int
    tokens: int  # the source's token budget, or an estimate of a file's tokens
    shards: int  # parallel jobs (1: the token_rows job tokenises by itself)
    workers: int  # worker processes per job
    hours: float  # wall time, every shard at once

    @property
    def mem_mb(self) -> int:
        return JOB_MEMORY_MB + WORKER_MEMORY_MB * self.workers

    @property
    def runtime_minutes(self) -> int:
        return math.ceil(60 * (2 * self.hours + 1))


def source_tokens(config: dict, source: str) -> int:
    """The tokens a token_rows source holds: a corpus cut's budget; a prompt set's prompts at
    ``PROMPT_TOKENS`` each (with a completion, twice that)."""
    corpus = config["data"]["corpus"]
    if source == "stream":
        return corpus["stream_tokens"]
    if source == "subset":
        return corpus["subset_tokens"]
    spec = config["data"]["prompt_sets"][source[len("promptset_") :]]
    return spec["n"] * PROMPT_TOKENS * (2 if spec.get("completion_field") else 1)


def plan_tokenize(config: dict, source: str, selection: str, seq_len: int) -> TokenizePlan:
    workers = WORKERS if config.get("cluster") else LOCAL_WORKERS
    tokens = source_tokens(config, source)
    per_job = workers * TOKENS_PER_SECOND * TARGET_HOURS * 3600
    shards = max(1, math.ceil(tokens / per_job))
    if source == "stream":  # a config may fix the stream's job count (the stand-in runs the paper's sharded path)
        shards = config["data"]["corpus"].get("stream_shards", shards)
    hours = tokens / (shards * workers * TOKENS_PER_SECOND) / 3600
    return TokenizePlan(source, selection, seq_len, tokens, shards, workers, hours)


def plan_tokenize_jobs(resolved: Resolved) -> list[TokenizePlan]:
    """A plan for every token_rows folder the config's conversions train on."""

    keys = sorted({resolved.conversion_rows(j.run) for j in resolved.conversions})
    return [plan_tokenize(resolved.config, *k) for k in keys]
