"""Pre-tokenised rows: the rows the trainer would tokenise itself, memory-mapped in shards, read in
O(1) from any micro-batch on."""

import pytest
import torch

from ar2dlm.data.token_rows import TokenRows, document_rows, write_token_rows
from ar2dlm.training.data import Batches

INFO = {"source": "subset", "selection": "documents", "ordered": False}


@pytest.fixture(scope="module")
def corpus(smoke_tokenizer, tmp_path_factory):
    tok, docs = smoke_tokenizer
    folder = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(folder)
    text = "".join(d["completion"] for d in docs[:40])  # a long plain-text document: split into several rows
    return tok, folder, docs + [{"prompt": "", "completion": text}]


@pytest.mark.parametrize("workers", [1, 2])
def test_rows_are_what_the_trainer_would_tokenise_in_shards(corpus, tmp_path, workers):
    tok, folder, docs = corpus
    index = write_token_rows(docs, folder, 48, tok.pad_token_id, tmp_path / "rows", info=INFO, workers=workers,
                             shard_rows=100)
    want = document_rows(docs, tok, 48)
    rows = TokenRows(tmp_path / "rows")
    assert len(index["shards"]) == -(-len(want) // 100) > 2 and len(rows) == len(want) == index["rows"]
    assert [rows[i] for i in range(len(rows))] == want
    assert index["tokens"] == sum(len(r) for r, _ in want)
    with pytest.raises(IndexError):
        rows[len(rows)]


def test_a_stream_stops_at_its_budget(corpus, tmp_path):
    tok, folder, docs = corpus
    index = write_token_rows(iter(docs), folder, 48, tok.pad_token_id, tmp_path / "rows", info=INFO,
                             budget_tokens=1000, shard_rows=7)
    assert 1000 <= index["tokens"] < 1000 + 48 and index["rows"] < len(docs)


def test_micro_batches_from_rows_on_disk_match_and_seek(corpus, tmp_path):
    tok, folder, docs = corpus
    write_token_rows(docs, folder, 48, tok.pad_token_id, tmp_path / "rows", info=INFO, shard_rows=64)
    disk = Batches(TokenRows(tmp_path / "rows"), 8, 3, tok.pad_token_id)
    memory = Batches(document_rows(docs, tok, 48), 8, 3, tok.pad_token_id)
    for index in (0, 5, 200):  # 200: a later epoch
        assert all(torch.equal(a, b) for a, b in zip(disk.whole(index), memory.whole(index)))
    resumed = list(disk.loader(200, 203))  # a resumed run reads from its own micro-batch on
    assert all(torch.equal(a, b) for a, b in zip(resumed[0], memory.whole(200))) and len(resumed) == 3
    ordered = Batches(TokenRows(tmp_path / "rows"), 8, 3, tok.pad_token_id, ordered=True)
    assert torch.equal(ordered.whole(1)[0][0, :5], torch.tensor(TokenRows(tmp_path / "rows")[8][0][:5]))
    with pytest.raises(ValueError, match="stream read once"):
        ordered.whole(len(memory.rows) // 8 + 1)


def test_a_stream_not_written_out_is_read_from_its_source_once_in_order(corpus, tmp_path):
    """The paper's stream: its manifest names the source; the rows are tokenised from it up to the
    budget (here a local JSON file through ``datasets``, as the hub would be) and trained in order."""
    import json

    from ar2dlm.data.build import build_token_rows
    from ar2dlm.provenance import write_json

    tok, folder, docs = corpus
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps({"text": d["prompt"] + d["completion"]}) + "\n" for d in docs))
    manifest = {"seed": 0, "corpus_source": "hub", "corpus_path": "json", "corpus_name": None,
                "corpus_data_files": str(source), "corpus_split": "train", "corpus_text_field": "text",
                "corpus_prompt_field": None, "corpus_completion_field": None, "corpus_shuffle_buffer": 16,
                "stream": {"path": None, "budget_tokens": 2000}}
    write_json(tmp_path / "manifest.json", manifest)
    index = build_token_rows(tmp_path / "manifest.json", folder, "stream", "documents", 48, tmp_path / "rows")
    assert index["ordered"] and 2000 <= index["tokens"] < 2048
    rows = TokenRows(tmp_path / "rows")
    assert all(p == 0 for _, p in (rows[i] for i in range(len(rows))))  # plain text: no prompt
