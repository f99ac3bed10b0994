"""Hub assets: the paper preset's canonical ids, the cache check at DAG build (every missing asset
named, gated ones with HF_TOKEN), prefetch's token check, and the stand-in hub read by id offline."""

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_snakemake

PAPER = str(REPO / "config" / "presets" / "paper.yaml")


@pytest.fixture
def paper():
    from ar2dlm.pipeline.config import load_preset

    return load_preset("paper", REPO / "config")


@pytest.fixture
def standin_cache(standin_hub, monkeypatch):
    """This process reads the stand-in hub as its hub cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(standin_hub))
    return standin_hub


def test_paper_assets_are_the_canonical_ids(paper):
    from ar2dlm.pipeline.assets import assets_for, hub_assets

    assets = {(a.repo_type, a.repo_id): a for a in hub_assets(paper)}
    assert set(assets) == {
        ("model", "Qwen/Qwen3-0.6B-Base"),
        ("model", "Qwen/Qwen3-1.7B-Base"),
        ("model", "Qwen/Qwen3-4B-Base"),
        ("model", "Qwen/Qwen3-8B-Base"),
        ("dataset", "OpenCoder-LLM/opc-fineweb-code-corpus"),
        ("dataset", "HuggingFaceH4/ultrafeedback_binarized"),
        ("dataset", "HuggingFaceH4/ultrachat_200k"),
        ("dataset", "EleutherAI/hendrycks_math"),
        ("dataset", "Maxwell-Jia/AIME_2024"),
        ("dataset", "Idavidrein/gpqa"),
        ("dataset", "mteb/scifact"),
        ("dataset", "mteb/nfcorpus"),
        ("dataset", "mteb/stsbenchmark-sts"),
        ("dataset", "mteb/banking77"),
        # AR-MAP's truthfulness and maths preferences, their benchmarks, and the helpfulness judge
        ("dataset", "jondurbin/truthy-dpo-v0.1"),
        ("dataset", "argilla/distilabel-math-preference-dpo"),
        ("dataset", "truthfulqa/truthful_qa"),
        ("dataset", "openai/gsm8k"),
        ("model", "Skywork/Skywork-Reward-V2-Qwen3-0.6B"),
    }
    # the tokenizer is the 0.6B model's repository, listed once for both uses
    assert set(assets["model", "Qwen/Qwen3-0.6B-Base"].used_by) == {"models.qwen3_0_6b", "data.tokenizer"}
    assert assets["dataset", "Idavidrein/gpqa"].gated and not assets["dataset", "Maxwell-Jia/AIME_2024"].gated
    assert len(assets["dataset", "mteb/scifact"].revision) == 40  # mteb pins a commit
    assert [a.repo_id for a in assets_for(list(assets.values()), "eval.benchmarks.aime24")] == ["Maxwell-Jia/AIME_2024"]
    judge = assets_for(list(assets.values()), "eval.benchmarks.helpfulness")
    assert [(a.repo_type, a.repo_id) for a in judge] == [("model", "Skywork/Skywork-Reward-V2-Qwen3-0.6B")]


def test_a_dag_build_without_the_cache_names_every_missing_asset(tmp_path):
    proc = run_snakemake(
        ["all_tables", "--cores", "1", "--configfile", PAPER], tmp_path, timeout=120, hub_cache=tmp_path / "empty_hub"
    )
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert not (tmp_path / "results").exists()  # failed before any job
    for repo in ("Qwen/Qwen3-8B-Base", "OpenCoder-LLM/opc-fineweb-code-corpus", "Idavidrein/gpqa", "mteb/banking77"):
        assert repo in err, repo
    assert "snakemake prefetch" in err and "HF_TOKEN" in err
    # a dry run still shows the plan (read before prefetch), with the same list as a warning
    dry = run_snakemake(
        ["-n", "all_tables", "--configfile", PAPER], tmp_path, timeout=120, hub_cache=tmp_path / "empty_hub"
    )
    assert dry.returncode == 0 and "rule convert:" in dry.stdout
    assert "Warning (dry run)" in dry.stderr and "Qwen/Qwen3-8B-Base" in dry.stderr


def test_prefetch_needs_a_token_for_a_gated_set_before_any_download(tmp_path):
    no_token = {"HF_HOME": str(tmp_path / "hf_home"), "HF_TOKEN": ""}
    proc = run_snakemake(
        ["-n", "prefetch", "--configfile", PAPER], tmp_path, timeout=120, hub_cache=tmp_path / "empty_hub", **no_token
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "HF_TOKEN" in out and "https://huggingface.co/datasets/Idavidrein/gpqa" in out
    proc = run_snakemake(
        ["-n", "prefetch", "--configfile", PAPER],
        tmp_path,
        timeout=120,
        hub_cache=tmp_path / "empty_hub",
        **{**no_token, "HF_TOKEN": "hf_token_for_the_test"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rule prefetch:" in proc.stdout and "rule code_benchmark:" in proc.stdout  # evalplus files too


def test_standin_hub_reads_by_id_in_the_hub_schemas(standin_cache):
    from ar2dlm.core.hub import load_hub_dataset, local_snapshot
    from ar2dlm.data.build import hub_preferences
    from ar2dlm.evaluation.suite import cached_harness_task

    prefs = load_hub_dataset("HuggingFaceH4/ultrafeedback_binarized", split="test_prefs")
    assert {"prompt", "prompt_id", "chosen", "rejected", "messages", "score_chosen", "score_rejected"} <= set(
        prefs.features
    )
    assert prefs[0]["chosen"][-1]["role"] == "assistant"
    rows = hub_preferences(
        {
            "path": "HuggingFaceH4/ultrafeedback_binarized",
            "train_split": "train_prefs",
            "prompt_field": "prompt",
            "chosen_field": "chosen",
            "rejected_field": "rejected",
        },
        "train",
        4,
        0,
        "helpful",
    )
    assert len(rows) == 4 and all(r["chosen"] != r["rejected"] for r in rows)
    algebra = load_hub_dataset("EleutherAI/hendrycks_math", "algebra", split="train")
    assert set(algebra.features) == {"problem", "level", "type", "solution"}
    gpqa = cached_harness_task("gpqa_diamond_zeroshot")  # lm-eval's own config, its data set read from the cache
    assert gpqa["dataset_path"] == local_snapshot("Idavidrein/gpqa") and gpqa["dataset_name"] == "gpqa_diamond"
    docs = gpqa["process_docs"](load_hub_dataset("Idavidrein/gpqa", "gpqa_diamond", split="train"))
    assert docs[0]["answer"] in {"(A)", "(B)", "(C)", "(D)"}


def test_standin_models_have_the_real_vocabulary_and_base_convention(standin_cache):
    from transformers import AutoConfig

    from ar2dlm.core.hub import local_snapshot
    from ar2dlm.data.tokenization import load_pretrained_tokenizer

    tok = load_pretrained_tokenizer("Qwen/Qwen3-0.6B-Base")
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.mask_token_id == 151669
    small, large = (
        AutoConfig.from_pretrained(local_snapshot(m, "model")) for m in ("Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-8B-Base")
    )
    assert small.vocab_size == large.vocab_size == 151936 and small.model_type == "qwen3"
    assert small.tie_word_embeddings and not large.tie_word_embeddings  # as the real 8B
    config = json.loads((Path(local_snapshot("Qwen/Qwen3-4B-Base", "model")) / "config.json").read_text())
    assert config["eos_token_id"] == tok.eos_token_id


def test_missing_asset_in_a_job_names_prefetch(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from ar2dlm.core.hub import MissingAssetError, load_hub_dataset

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(MissingAssetError, match="snakemake prefetch"):
        load_hub_dataset("HuggingFaceH4/ultrachat_200k", split="train_sft")


def test_task_lookups_are_fast_and_quiet_on_a_cold_cache(tmp_path, monkeypatch, capfd):
    """The paper's lm-eval tasks are found from the task files' own lines (not lm-eval's 15-50 s
    index), and listing mteb's tasks prints none of its 504 beta-task warnings."""
    import lm_eval.tasks

    from ar2dlm.core.hub import lm_eval_task_path
    from ar2dlm.evaluation.suite import installed_tasks

    def no_index(*a, **k):
        raise AssertionError("lm-eval's task index was built")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", no_index)
    paths = {t: lm_eval_task_path(t) for t in ("aime24", "gpqa_diamond_zeroshot", "gsm8k", "truthfulqa_mc2")}
    for task, path in paths.items():
        assert path.endswith(".yaml") and f"task: {task}" in open(path).read()
    _, names = installed_tasks("mteb")
    assert "SciFact" in names
    assert "currently in beta" not in "".join(capfd.readouterr())
