"""Pre-tokenised rows: packed text or one document per row, tokenised by parallel resumable shard
jobs whose merge is the same for any number of shards, memory-mapped and read in O(1) from any
micro-batch on."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ar2dlm.data.token_rows import TokenRows, document_rows, document_tokens, packed_rows
from ar2dlm.data.token_shards import RowsJob, merge_shards, needed_tokens, write_shard, write_token_rows
from ar2dlm.training.data import Batches
from tests.conftest import REPO

INFO = {"source": "subset", "selection": "documents", "ordered": False}
SETTINGS = {"source": "test"}
SMALL = {"chunk_docs": 8, "part_tokens": 300}  # many chunks and parts from a few hundred documents


@pytest.fixture(scope="module")
def corpus(smoke_tokenizer, tmp_path_factory):
    tok, docs = smoke_tokenizer
    folder = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(folder)
    text = "".join(d["completion"] for d in docs[:40])  # a long plain-text document: split into several rows
    return tok, folder, docs + [{"prompt": "", "completion": text}]


def rows_of(folder) -> list:
    rows = TokenRows(folder)
    return [rows[i] for i in range(len(rows))]


def rows_job(tok, folder, docs, *, packed, budget=None, info=INFO):
    """What a one-job tokenisation and the shard jobs with their merge are given."""
    return RowsJob(
        lambda: iter(docs),
        folder,
        48,
        packed,
        settings=SETTINGS,
        info=info,
        pad_id=tok.pad_token_id,
        budget_tokens=budget,
        **SMALL,
    )


def one_job(tok, folder, docs, out, *, packed, budget=None, workers=1, info=INFO):
    return write_token_rows(rows_job(tok, folder, docs, packed=packed, budget=budget, info=info), out, workers)


def sharded(tok, folder, docs, out, shards, *, packed, budget=None, stop=None):
    """``shards`` shard jobs and their merge; ``stop``: where each shard stops (default: its share)."""
    from ar2dlm.data.token_shards import shard_stop_tokens

    job = rows_job(tok, folder, docs, packed=packed, budget=budget)
    need = needed_tokens(budget, 48, packed)
    dirs = [out.with_name(f"{out.name}.shard{k}") for k in range(shards)]
    for k, d in enumerate(dirs):
        stop_tokens = stop if stop is not None else shard_stop_tokens(need, shards)
        write_shard(job, d, shard=k, shards=shards, stop_tokens=stop_tokens)
    return merge_shards(job, dirs, out)


@pytest.mark.parametrize("workers", [1, 2])
def test_document_rows_are_what_the_trainer_would_tokenise(corpus, tmp_path, workers):
    tok, folder, docs = corpus
    index = one_job(tok, folder, docs, tmp_path / "rows", packed=False, workers=workers)
    want = document_rows(docs, tok, 48)
    assert not index["packed"] and len(index["files"]) > 2  # written in several parts
    assert rows_of(tmp_path / "rows") == want and index["rows"] == len(want)
    assert index["tokens"] == sum(len(r) for r, _ in want) and any(p > 0 for _, p in want)
    assert not (tmp_path / "rows.partial").exists()
    with pytest.raises(IndexError):
        TokenRows(tmp_path / "rows")[len(want)]


def test_packed_rows_join_documents_with_end_of_text_and_hold_no_padding(corpus, tmp_path):
    tok, folder, docs = corpus
    index = one_job(tok, folder, docs, tmp_path / "rows", packed=True, workers=2)
    stream = document_tokens(docs, tok)
    rows = rows_of(tmp_path / "rows")
    assert rows == packed_rows(stream, 48) and len(rows) == len(stream) // 48
    assert all(len(r) == 48 and p == 0 for r, p in rows)  # every slot a token
    assert index["tokens"] == 48 * len(rows) and stream.count(tok.eos_token_id) == len(docs)
    assert sum(r.count(tok.eos_token_id) for r, _ in rows) >= len(docs) - 1  # documents end to end


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("budget", [None, 3000])
def test_any_number_of_shards_gives_the_rows_of_one_job(corpus, tmp_path, packed, budget):
    tok, folder, docs = corpus
    one = one_job(tok, folder, docs, tmp_path / "one", packed=packed, budget=budget)
    three = sharded(tok, folder, docs, tmp_path / "three", 3, packed=packed, budget=budget)
    assert rows_of(tmp_path / "three") == rows_of(tmp_path / "one")
    assert (one["rows"], one["tokens"]) == (three["rows"], three["tokens"])
    if budget is not None and packed:
        assert three["rows"] == -(-budget // 48)  # the whole rows covering the budget


def test_the_merge_tokenises_what_a_short_shard_lacks(corpus, tmp_path):
    tok, folder, docs = corpus
    one_job(tok, folder, docs, tmp_path / "one", packed=True, budget=3000)
    short = sharded(tok, folder, docs, tmp_path / "short", 2, packed=True, budget=3000, stop=500)  # 1000 of 3024
    assert short["topped_up_chunks"] > 0
    assert rows_of(tmp_path / "short") == rows_of(tmp_path / "one")


def test_a_source_shorter_than_its_budget_is_refused_naming_it(corpus, tmp_path):
    tok, folder, docs = corpus
    total = len(document_tokens(docs, tok))
    info = {**INFO, "source": "stream", "origin": "org/corpus, split train", "budget_key": "data.corpus.stream_tokens"}
    with pytest.raises(
        ValueError,
        match=rf"stream \(org/corpus, split train\) holds only {total} tokens.*budget of "
        rf"{total + 1000} \(data\.corpus\.stream_tokens\)",
    ):
        one_job(tok, folder, docs, tmp_path / "rows", packed=True, budget=total + 1000, info=info)
    assert not (tmp_path / "rows").exists()


KILLED_WRITER = """
import itertools, json, sys, time
from ar2dlm.data.token_shards import RowsJob, write_shard
docs = [json.loads(line) for line in open(sys.argv[1])]
def stalling():  # the source stalls after a third of it: the writer has written parts by then
    yield from docs[:len(docs) // 3]
    time.sleep(600)
    yield from docs[len(docs) // 3:]
job = RowsJob(stalling, sys.argv[2], 48, True, settings={"source": "test"}, chunk_docs=8, part_tokens=300)
write_shard(job, sys.argv[3], shard=1, shards=2, workers=1)
"""


def test_a_killed_shard_resumes_where_it_stopped_and_writes_the_same_bytes(corpus, tmp_path):
    tok, folder, docs = corpus
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs))
    work = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(source), str(folder), str(work)],
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.time() + 120
        while not (work / "progress.json").is_file() or not json.loads((work / "progress.json").read_text())["parts"]:
            assert proc.poll() is None and time.time() < deadline, "the writer ended before writing a part"
            time.sleep(0.2)
        time.sleep(1)  # more parts, then the stall
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    progress = json.loads((work / "progress.json").read_text())
    assert progress["parts"] and not progress["done"]
    (work / "part-09999-tokens.npy.tmp").write_bytes(b"half a file")  # as a kill mid-write leaves it
    (work / f"part-{len(progress['parts']):05d}-tokens.npy").write_bytes(b"a part written, never recorded")
    job = rows_job(tok, folder, docs, packed=True)
    resumed = write_shard(job, work, shard=1, shards=2)
    whole = write_shard(job, tmp_path / "whole", shard=1, shards=2)
    assert resumed == whole and len(whole["parts"]) > len(progress["parts"])
    files = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert sorted(p.name for p in work.iterdir()) == files
    for name in files:
        assert (work / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_a_shard_written_under_other_settings_starts_over(corpus, tmp_path):
    tok, folder, docs = corpus

    def job(part, source):
        return RowsJob(lambda: iter(part), folder, 48, True, settings={"source": source}, **SMALL)

    write_shard(job(docs[:50], "old"), tmp_path / "w")
    fresh = write_shard(job(docs, "new"), tmp_path / "w")
    assert fresh["tokens"] == len(document_tokens(docs, tok))
    again = write_shard(job([], "new"), tmp_path / "w")  # done: nothing read
    assert again == fresh


def test_micro_batches_from_rows_on_disk_match_and_seek(corpus, tmp_path):
    tok, folder, docs = corpus
    one_job(tok, folder, docs, tmp_path / "rows", packed=True)
    disk = Batches(TokenRows(tmp_path / "rows"), 8, 3, tok.pad_token_id)
    memory = Batches(packed_rows(document_tokens(docs, tok), 48), 8, 3, tok.pad_token_id)
    for index in (0, 5, 200):  # 200: a later epoch
        assert all(torch.equal(a, b) for a, b in zip(disk.whole(index), memory.whole(index)))
    assert bool(disk.whole(0)[1].all())  # valid everywhere: no padding
    resumed = list(disk.loader(200, 203))  # a resumed run reads from its own micro-batch on
    assert all(torch.equal(a, b) for a, b in zip(resumed[0], memory.whole(200))) and len(resumed) == 3


def test_a_stream_read_once_refuses_a_run_longer_than_it_before_the_first_step(corpus, tmp_path):
    tok, folder, docs = corpus
    one_job(tok, folder, docs, tmp_path / "rows", packed=True)
    rows = TokenRows(tmp_path / "rows")
    ordered = Batches(rows, 8, 3, tok.pad_token_id, ordered=True)
    assert torch.equal(ordered.whole(1)[0][0], torch.tensor(rows[8][0]))  # in order
    fits = len(rows) // 8
    ordered.loader(0, fits)
    with pytest.raises(
        ValueError,
        match=rf"subset \(documents, packed rows of 48 tokens.*holds {len(rows)} rows; "
        rf"the run's {fits + 1} micro-batches of 8 rows need {8 * fits + 8}",
    ):
        ordered.loader(fits - 1, fits + 1)  # a resumed segment: the whole run is checked


def test_a_stream_not_written_out_is_read_from_its_source_once_in_order(corpus, tmp_path):
    """The paper's stream: its manifest names the source; the rows are tokenised from it up to the
    budget (here a local JSON file through ``datasets``, as the hub would be), packed, and trained
    in order; split over shard jobs, the same rows."""
    from ar2dlm.data.build import build_token_rows, rows_job
    from ar2dlm.provenance import write_json

    tok, folder, docs = corpus
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps({"text": d["prompt"] + d["completion"]}) + "\n" for d in docs))
    manifest = {
        "seed": 0,
        "corpus_source": "hub",
        "corpus_path": "json",
        "corpus_name": None,
        "corpus_data_files": str(source),
        "corpus_split": "train",
        "corpus_text_field": "text",
        "corpus_prompt_field": None,
        "corpus_completion_field": None,
        "corpus_shuffle_buffer": 16,
        "stream": {"path": None, "budget_tokens": 2000},
    }
    write_json(tmp_path / "manifest.json", manifest)
    job = rows_job(tmp_path / "manifest.json", folder, "stream", "documents", 48)
    index = build_token_rows(job, tmp_path / "rows")
    assert index["ordered"] and index["packed"] and index["rows"] == -(-2000 // 48) and index["tokens"] == 48 * 42
    shards = [tmp_path / f"shard{k}" for k in range(2)]
    for k, d in enumerate(shards):
        build_token_rows(job, d, shard=k, shards=2)
    build_token_rows(job, tmp_path / "merged", shard_dirs=shards)
    assert rows_of(tmp_path / "merged") == rows_of(tmp_path / "rows")
    assert np.load(tmp_path / "merged" / "segments.npy")[:, 2].sum() == 48 * 42  # cut at the budget's rows


@pytest.mark.parametrize("preset", ["smoke", "paper"])
def test_a_run_trains_on_the_layout_its_token_rows_folder_holds(preset):
    """The trainer's own tokenisation of a corpus file (``run_packs``) and the token_rows folder the
    pipeline gives the run (``packs`` of its source and selection) agree for every run."""
    from ar2dlm.data.token_rows import packs, run_packs
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    resolved = resolve(merge_preset({"preset": preset}, REPO / "config"))
    layouts = {name: packs(*resolved.conversion_rows(name)[:2]) for name in resolved.runs}
    assert layouts == {name: run_packs(run) for name, run in resolved.runs.items()}
    # tiny (and so smoke) trains every conversion on document rows; the paper preset packs its corpora
    assert (True in layouts.values()) == (preset == "paper") and False in layouts.values()
