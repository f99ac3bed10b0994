"""AR-MAP: merges over state dicts, spectra, the gamma search with common random numbers, DPO."""

from unittest import mock

import pytest
import torch

from ar2dlm.armap.merge import MergeSettings, stream_merge
from ar2dlm.armap.spectra import matrix_stats, streamed_spectra
from ar2dlm.core.models import CheckpointError, FolderWeights, build_qwen3, load_model, save_model
from ar2dlm.training.teacher import ar_conventions
from tests.reference_armap import add_scaled, dare, merged_vector, spectra_table, task_vector, ties, trim
from tests.shared import TINY_ARCH, dpo_argv, torchrun


def _sd(seed, shape=(16, 24)):
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(shape, generator=g),
        "b.bias": torch.randn(shape[0], generator=g),
        "step": torch.tensor(3),
    }


def test_task_vector_of_identical_models_is_zero_and_gamma_zero_is_the_base():
    base = _sd(0)
    tau = task_vector(base, base)
    assert set(tau) == {"a.weight", "b.bias"} and all(torch.count_nonzero(t) == 0 for t in tau.values())
    other = task_vector(_sd(1), base)
    merged = add_scaled(base, other, 0.0)
    assert all(merged[k] is base[k] for k in base)  # bitwise: the very tensors
    assert torch.allclose(add_scaled(base, other, 1.0)["a.weight"], _sd(1)["a.weight"], atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        task_vector(_sd(0, (8, 24)), base)


@pytest.mark.parametrize("density", [0.05, 0.2, 0.5, 1.0])
def test_ties_keeps_the_requested_density(density):
    tau = task_vector(_sd(1), _sd(0))
    merged = ties([tau], density)
    for k, t in merged.items():
        assert torch.count_nonzero(t) == max(1, round(density * t.numel()))
        kept = t != 0  # the largest magnitudes survive, unchanged
        assert torch.equal(t[kept], tau[k][kept])
        if not kept.all():
            assert tau[k][kept].abs().min() >= tau[k][~kept].abs().max()


def test_ties_elects_signs_and_averages_agreeing_entries():
    a = {"w": torch.tensor([1.0, -2.0, 3.0, 0.5])}
    b = {"w": torch.tensor([3.0, 1.0, -1.0, 0.5])}
    merged = ties([a, b], 1.0)["w"]
    # entry 0: both +, mean 2; entry 1: sum -1 -> sign -, only a agrees: -2; entry 2: sum 2 -> +, only a: 3
    assert torch.allclose(merged, torch.tensor([2.0, -2.0, 3.0, 0.5]))
    assert torch.count_nonzero(trim(a, 0.5)["w"]) == 2


def test_dare_is_unbiased():
    tau = task_vector(_sd(1), _sd(0))
    draws = torch.stack([dare(tau, 0.7, seed=s)["a.weight"] for s in range(2000)])
    dropped = (draws[0] == 0).float().mean()
    assert abs(float(dropped) - 0.7) < 0.05
    err = (draws.mean(0) - tau["a.weight"]).abs() / tau["a.weight"].abs().clamp(min=0.2)
    assert float(err.mean()) < 0.05  # sampling error of a mean over 2000 draws
    with pytest.raises(ValueError):
        dare(tau, 1.0)


def test_matrix_stats_of_known_spectra():
    u, v = torch.randn(20, 1), torch.randn(1, 12)
    rank1 = matrix_stats(u @ v)
    assert rank1["effective_rank"] == pytest.approx(1.0, abs=1e-3) and rank1["top8_energy"] == pytest.approx(1.0)
    assert rank1["spectral_norm"] == pytest.approx(rank1["frobenius_norm"], rel=1e-4)
    eye = matrix_stats(torch.eye(10))
    assert eye["effective_rank"] == pytest.approx(10.0, rel=1e-4) and eye["top8_energy"] == pytest.approx(0.8)
    table = spectra_table(
        {"model.layers.1.mlp.up_proj.weight": torch.eye(4)}, {"model.layers.1.mlp.up_proj.weight": 3 * torch.eye(4)}
    )
    row = table.iloc[0]
    assert row["layer"] == 1 and row["module"] == "up_proj" and row["module_type"] == "mlp"
    assert row["shadowing_ratio"] == pytest.approx(3.0)


@pytest.fixture(scope="module")
def models(smoke_tokenizer, tmp_path_factory):
    """An AR teacher, its 'DPO' version (perturbed weights) and a block-attention DLM."""
    tok, _ = smoke_tokenizer
    root = tmp_path_factory.mktemp("armap")
    ar = build_qwen3(dict(TINY_ARCH, init_seed=0), tok)
    save_model(ar, tok, root / "ar", {**ar_conventions(tok), "method": "test"})
    torch.manual_seed(1)
    with torch.no_grad():
        for p in ar.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_model(ar, tok, root / "dpo", {**ar_conventions(tok), "method": "test"})
    dlm = build_qwen3(dict(TINY_ARCH, init_seed=2), tok)
    save_model(
        dlm,
        tok,
        root / "dlm",
        {**ar_conventions(tok), "attention": "block", "shift": False, "block_size": 4, "method": "test"},
    )
    return root


def _pairs(n):
    from ar2dlm.data.math_suite import generate_math_suite
    from ar2dlm.data.preferences import make_preferences

    _, held, _ = generate_math_suite(5, 40, seed=0)
    return make_preferences("math", held, n, seed=0, split="eval")


def test_gamma_search_uses_common_random_numbers_and_writes_a_decodable_dlm(models, tmp_path):
    from ar2dlm.armap.gamma import GammaSearch
    from ar2dlm.armap.pipeline import ArmapFolders, search
    from ar2dlm.core.engine import generate
    from ar2dlm.core.sampling import Decoding
    from ar2dlm.provenance import read_json

    cfg = {"grid": [0, 1, 3], "beta": 0.1, "elbo_samples": 2, "batch_size": 32, "merges": {"task_arithmetic": {}}}
    rows = _pairs(12)
    a = search(
        ArmapFolders(models / "ar", models / "dpo", models / "dlm"),
        rows,
        GammaSearch.from_config(cfg, "task_arithmetic", 0),
        tmp_path / "a.json",
        tmp_path / "merged",
    )
    b = search(
        ArmapFolders(models / "ar", models / "dpo", models / "dlm"),
        rows,
        GammaSearch.from_config(cfg, "task_arithmetic", 0),
        tmp_path / "b.json",
        tmp_path / "merged_b",
    )
    # gamma 0 is the reference itself: with shared masks every margin is exactly zero, each tie counting half
    assert a["curve"][0]["reward_accuracy"] == a["curve"][0]["test_reward_accuracy"] == 0.5
    assert [r["reward_accuracy"] for r in a["curve"]] == [r["reward_accuracy"] for r in b["curve"]]
    assert read_json(tmp_path / "a.json")["gamma_hat"] == a["gamma_hat"] in cfg["grid"]
    model, tok, conv, info = load_model(tmp_path / "merged")
    assert (
        info["attention"] == "block" and info["gamma"] == a["gamma_hat"] and info["method"] == "armap_task_arithmetic"
    )
    expected = add_scaled(
        load_model(models / "dlm").model.state_dict(),
        task_vector(load_model(models / "dpo").model.state_dict(), load_model(models / "ar").model.state_dict()),
        a["gamma_hat"],
    )
    assert all(torch.allclose(model.state_dict()[k], expected[k], atol=1e-6) for k in expected)
    outs, stats = generate(model, conv, [tok("Question:")["input_ids"]], Decoding(8))
    assert stats["decoder"] == "dlm" and stats["block_size"] == 4


LORA = {"r": 4, "alpha": 8}


def _check_lora_delta(base_dir, dpo_dir, r: int) -> None:
    """A merged LoRA changes only the adapted linear layers, each by a delta of rank at most r."""
    base, tuned = FolderWeights(base_dir), FolderWeights(dpo_dir)
    changed = []
    for n in base.names():
        delta = tuned[n].float() - base[n].float()
        if n.endswith("proj.weight"):
            changed.append(bool(delta.abs().max() > 0))
            assert torch.linalg.matrix_rank(delta, atol=1e-6) <= r
        else:  # embeddings and norms are not adapted
            assert torch.equal(tuned[n], base[n]), n
    assert all(changed)


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_ar_dpo_with_trl_raises_held_out_reward_accuracy(models, tmp_path, lora):
    from ar2dlm.armap.dpo import DpoJob, train_dpo

    rows = _pairs(40)
    cfg = {"beta": 0.1, "steps": 30, "lr": 3e-3, "batch_size": 8, "max_length": 128, "lora": lora}
    info = train_dpo(DpoJob(models / "ar", rows[:32], rows[32:], tmp_path / "dpo", cfg, seed=0, domains=["math"]))
    assert info["reward_accuracy_before"] == 0.0 and info["reward_accuracy"] > 0.5
    assert load_model(tmp_path / "dpo").info["method"] == "ar_dpo"
    if lora:
        _check_lora_delta(models / "ar", tmp_path / "dpo", lora["r"])


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_dlm_dpo_learns_its_training_pairs(models, tmp_path, lora):
    from ar2dlm.armap.dpo import DpoJob, train_dpo

    rows = _pairs(16)
    cfg = {
        "beta": 0.5,
        "steps": 30,
        "lr": 3e-3,
        "batch_size": 8,
        "grad_accum": 2,
        "max_length": 128,
        "elbo_samples": 4,
        "eval_elbo_samples": 4,
        "lora": lora,
    }
    info = train_dpo(DpoJob(models / "dlm", rows, rows, tmp_path / "dpo", cfg, seed=0, domains=["math"]))
    assert info["reward_accuracy_before"] == 0.5 and info["reward_accuracy"] > 0.6
    losses = [r["loss"] for r in info["log"] if "loss" in r]  # TRL's log, every 10 steps
    assert losses[-1] < losses[0]
    if lora:
        _check_lora_delta(models / "dlm", tmp_path / "dpo", lora["r"])


@pytest.mark.parametrize(
    "extra",
    [{"antithetic": True}, {"objective": "simpo", "beta": 2.0, "gamma": 0.5, "steps": 60, "antithetic": True}],
    ids=["vrpo_antithetic", "simpo"],
)
def test_dlm_preference_baselines_learn_their_training_pairs(models, tmp_path, extra):
    """VRPO's antithetic masks (each with its complement) and SimPO (TRL's CPO trainer, no
    reference) train the DLM on ELBO log-likelihoods: the held-out implicit reward margin against
    the untrained DLM turns positive, the loss falls; SimPO keeps no reference copy. SimPO's
    margin, between two independently masked ELBOs, is noisier and needs more steps."""
    from ar2dlm.armap import dpo

    rows = _pairs(16)
    cfg = {"beta": 0.5, "steps": 20, "lr": 3e-3, "batch_size": 8, "max_length": 128, "elbo_samples": 2}
    cfg |= {"eval_elbo_samples": 4, **extra}
    made = []
    make = dpo.make_trainer
    with mock.patch.object(dpo, "make_trainer", lambda *a, **k: made.append(make(*a, **k)) or made[-1]):
        info = dpo.train_dpo(dpo.DpoJob(models / "dlm", rows, rows, tmp_path / "out", cfg, seed=0, domains=["math"]))
    assert info["reward_accuracy_before"] == 0.5 and info["reward_accuracy"] > 0.6
    losses = [r["loss"] for r in info["log"] if "loss" in r]
    assert losses[-1] < losses[0]
    trainer = made[0]
    assert trainer.antithetic == extra.get("antithetic", False)
    _assert_masks(trainer, shared=True)
    if "gamma" in extra:
        assert type(trainer).__name__ == "DLMSimPOTrainer" and trainer.loss_type == "simpo"
        assert trainer.simpo_gamma == 0.5 and trainer.cpo_alpha == 0 and not hasattr(trainer, "ref_model")
    assert load_model(tmp_path / "out").info["method"] == f"dlm_{extra.get('objective', 'dpo')}"


def _assert_masks(trainer, shared: bool) -> None:
    """Whether the reference (scored without gradients, as TRL does) draws the policy's masks."""
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        reference = trainer._mask_seed(ids)
    assert (trainer._mask_seed(ids) == reference) == shared


def test_plain_dlm_dpo_draws_the_references_masks_apart_from_the_policys(models, tmp_path):
    """Plain DLM DPO, the estimator VRPO improves on: the same trainer, the reference's masks drawn
    from another seed than the policy's (how well it learns beside VRPO is measured in the tiny_full
    grid, not here)."""
    from ar2dlm.armap import dpo

    rows = _pairs(16)
    cfg = {"beta": 0.5, "steps": 4, "lr": 3e-3, "batch_size": 8, "max_length": 128, "elbo_samples": 2}
    cfg |= {"eval_elbo_samples": 2, "objective": "plain_dpo"}
    made = []
    make = dpo.make_trainer
    with mock.patch.object(dpo, "make_trainer", lambda *a, **k: made.append(make(*a, **k)) or made[-1]):
        info = dpo.train_dpo(dpo.DpoJob(models / "dlm", rows, rows, tmp_path / "out", cfg, seed=0, domains=["math"]))
    (trainer,) = made
    assert type(trainer).__name__ == "DLMDPOTrainer" and trainer.ref_model is not None  # a frozen reference copy
    _assert_masks(trainer, shared=False)
    assert info["reward_accuracy_before"] == 0.5 and load_model(tmp_path / "out").info["method"] == "dlm_plain_dpo"
    trained, base = FolderWeights(tmp_path / "out"), FolderWeights(models / "dlm")
    assert any(not torch.equal(trained[n], base[n]) for n in base.names())


@pytest.mark.parametrize("merge,options", [("task_arithmetic", {}), ("ties", {"density": 0.2}), ("dare", {"p": 0.5})])
def test_streamed_merge_equals_the_state_dict_merge(models, merge, options):
    """Merging tensor by tensor from the folders gives the in-memory merge (DARE's draws in the
    folders' tensor order)."""
    ar, dpo, dlm = (FolderWeights(models / k) for k in ("ar", "dpo", "dlm"))
    tau = {n: dpo[n].float() - ar[n].float() for n in ar.names()}
    expected = add_scaled({n: dlm[n] for n in dlm.names()}, merged_vector(tau, merge, options, seed=3), 2.0)
    model = load_model(models / "dlm", device="cpu").model
    stream_merge(model, (dlm, dpo, ar), 2.0, MergeSettings(merge, options, seed=3))
    state = model.state_dict()
    assert all(torch.allclose(state[n], expected[n], atol=1e-6) for n in expected)
    stream_merge(model, (dlm, dpo, ar), 0.0, MergeSettings(merge, options, seed=3))
    assert all(torch.equal(state[n], dlm[n]) for n in dlm.names())  # gamma 0: the DLM itself


def test_streamed_spectra_equal_the_in_memory_table(models):
    ar, dpo, dlm = (FolderWeights(models / k) for k in ("ar", "dpo", "dlm"))
    pref = {n: dpo[n].float() - ar[n].float() for n in ar.names()}
    diff = {n: ar[n].float() - dlm[n].float() for n in ar.names()}
    streamed = streamed_spectra(ar, dpo, dlm)
    assert len(streamed) == sum(t.dim() == 2 for t in pref.values()) > 0
    assert streamed.equals(spectra_table(pref, diff))


def test_folder_weights_name_missing_and_mismatched_weights(models, smoke_tokenizer, tmp_path):
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        FolderWeights(tmp_path)
    wide = build_qwen3(dict(TINY_ARCH, hidden_size=64, init_seed=0), smoke_tokenizer[0])
    save_model(wide, smoke_tokenizer[0], tmp_path / "wide", {"method": "test"})
    with pytest.raises(ValueError, match=r"differ in weights: .*\(\d+, 32\) vs \(\d+, 64\)"):
        FolderWeights(models / "ar").check_matches(FolderWeights(tmp_path / "wide"))


def test_a_preference_job_names_the_domain_of_each_file(tmp_path, capsys):
    from ar2dlm.armap.dpo_run import main

    args = [
        "--model",
        str(tmp_path),
        "--train",
        "a.jsonl",
        "b.jsonl",
        "--domains",
        "math",
        "--eval",
        "e.jsonl",
        "--settings",
        "{}",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "out"),
    ]
    with pytest.raises(SystemExit):
        main(args)
    assert "--domains names 1 domains for 2 --train files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["ar", "dlm"])
def test_full_dpo_sharded_over_two_processes_learns_like_one(models, tmp_path, kind):
    """Full DPO in the FSDP2 trainer (AR-MAP's full-DPO option on several GPUs): two gloo processes
    under torchrun through the dpo rules' command line, policy and reference sharded, end where one
    process of the same trainer ends, and raise held-out reward accuracy."""
    import json
    import os
    import subprocess

    from ar2dlm.armap.dpo import DpoJob, train_dpo_sharded
    from ar2dlm.provenance import write_jsonl

    rows = _pairs(40)
    write_jsonl(tmp_path / "train.jsonl", rows[:32])
    write_jsonl(tmp_path / "eval.jsonl", rows[32:] if kind == "ar" else rows[:16])
    cfg = {
        "beta": 0.1 if kind == "ar" else 0.5,
        "steps": 12,
        "lr": 3e-3,
        "batch_size": 8,
        "grad_accum": 2,
        "max_length": 128,
        "train_pairs": None,
        "eval_pairs": None,
        "elbo_samples": 2,
        "eval_elbo_samples": 4,
    }
    cmd = [
        *torchrun(),
        "-m",
        "ar2dlm.armap.dpo_run",
        "--model",
        str(models / kind),
        "--train",
        str(tmp_path / "train.jsonl"),
        "--domains",
        "math",
        "--eval",
        str(tmp_path / "eval.jsonl"),
        "--settings",
        json.dumps(cfg),
        "--seed",
        "0",
        "--out",
        str(tmp_path / "two"),
        "--launch",
        json.dumps({"shard_teacher": True}),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = load_model(tmp_path / "two").info
    assert two["sharded"]["processes"] == 2 and two["method"] == ("ar_dpo" if kind == "ar" else "dlm_dpo")
    assert two["reward_accuracy_before"] == 0.5 and two["reward_accuracy"] > 0.5
    assert two["log"][-1]["dpo"] < two["log"][0]["dpo"]
    one = train_dpo_sharded(
        DpoJob(models / kind, rows[:32], rows[32:], tmp_path / "one", cfg, seed=0, domains=["math"])
    )
    assert one["sharded"]["processes"] == 1
    a, b = FolderWeights(tmp_path / "one"), FolderWeights(tmp_path / "two")
    assert all(torch.allclose(a[n], b[n], atol=2e-4) for n in a.names())


def test_pairs_are_cut_as_trls_dpo_collator_cuts_them(smoke_tokenizer):
    """The gamma search and DLM DPO's held-out scoring cut each pair to ``max_length`` tokens as TRL's
    DPO collator does (keep_start), and drop a pair whose prompt alone fills it, as TRL's dataset
    preparation does."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from ar2dlm.armap.dpo import encode_pairs as encoded_and_cut
    from ar2dlm.armap.dpo import scorable
    from ar2dlm.data.tokenization import encode_pair

    tok, _ = smoke_tokenizer
    rows = _pairs(8)
    long_prompt = {**rows[0], "prompt": rows[0]["prompt"] * 6}
    max_length = len(encode_pair(tok, rows[0]["prompt"], "", eos=False)[0]) + 5
    assert len(encode_pair(tok, long_prompt["prompt"], "", eos=False)[0]) >= max_length
    assert scorable(tok, rows + [long_prompt], max_length) == rows
    wins, loses = encoded_and_cut(tok, rows + [long_prompt], max_length)
    assert len(wins) == len(loses) == len(rows)
    full_w, full_l = encoded_and_cut(tok, rows)  # no max_length: whole pairs, for TRL's collator to cut
    examples = [{"prompt_ids": p, "chosen_ids": cw, "rejected_ids": cl} for (p, cw), (_, cl) in zip(full_w, full_l)]
    batch = DataCollatorForPreference(pad_token_id=tok.pad_token_id, max_length=max_length)(examples)
    trl_rows = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
    ours = [p + c for p, c in wins + loses]
    assert ours == trl_rows and max(len(r) for r in ours) == max_length  # chosen rows, then rejected rows
    assert any(len(p + c) > max_length for p, c in full_w + full_l)  # the cut is exercised


def test_scoring_runs_in_bf16_autocast_on_gpus_only():
    from types import SimpleNamespace

    from ar2dlm.armap.dpo import scoring_precision

    assert not isinstance(scoring_precision(SimpleNamespace(device=torch.device("cpu"))), torch.autocast)
    from contextlib import nullcontext

    # without a GPU torch builds the autocast context disabled, and says so
    no_gpu = pytest.warns(UserWarning, match="CUDA is not available")
    with nullcontext() if torch.cuda.is_available() else no_gpu:
        gpu = scoring_precision(SimpleNamespace(device=torch.device("cuda", 0)))
    assert isinstance(gpu, torch.autocast) and gpu.device == "cuda" and gpu.fast_dtype == torch.bfloat16
    assert not gpu._cache_enabled  # no bf16 copy of every fp32 weight kept for the whole search


def test_segment_work_folder_resumes_only_its_settings_and_results_replace_atomically(models, tmp_path, monkeypatch):
    from ar2dlm.armap import segments

    out = tmp_path / "dpo"
    work = segments.work_dir(out, {"steps": 4})
    for step, complete in ((2, True), (4, False)):
        (work / f"checkpoint-{step}").mkdir()
        if complete:
            (work / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert segments.last_checkpoint(work) == work / "checkpoint-2"  # the one a kill cut short is removed
    assert not (work / "checkpoint-4").exists() and segments.checkpoint_step(work / "checkpoint-2") == 2
    assert segments.work_dir(out, {"steps": 4}) == work and (work / "checkpoint-2").is_dir()
    segments.work_dir(out, {"steps": 8})  # other settings: a fresh run, the old checkpoints kept aside
    assert segments.last_checkpoint(work) is None
    aside = list(tmp_path.glob("dpo.train.superseded-*"))
    assert len(aside) == 1 and (aside[0] / "checkpoint-2").is_dir()
    model, tok, conv, _ = load_model(models / "dlm")
    segments.publish(model, tok, out, {**conv.to_dict(), "method": "first"})
    monkeypatch.setattr(segments, "save_model", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        segments.publish(model, tok, out, {**conv.to_dict(), "method": "second"})
    assert load_model(out).info["method"] == "first"  # a failed save leaves the earlier result whole


def _dpo_cli(models, tmp_path, out, cfg, *, launch=None, kill_at=None):
    """dlm_dpo's command line on the test DLM in a fresh process; ``kill_at``: SIGKILL the process at
    the end of that step, before anything of it is saved (a job killed at its time limit)."""
    import json
    import os
    import subprocess
    import sys

    from ar2dlm.provenance import write_jsonl

    rows = _pairs(16)
    write_jsonl(tmp_path / "train.jsonl", rows[:12])
    write_jsonl(tmp_path / "eval.jsonl", rows[12:])
    args = [
        *dpo_argv(("--model", models / "dlm"), tmp_path / "train.jsonl", tmp_path / "eval.jsonl", cfg, out),
        "--launch",
        json.dumps(launch or {}),
    ]
    script = (
        "import os, signal, sys\n"
        "from transformers import TrainerCallback\n"
        "import ar2dlm.armap.dpo as dpo\n"
        "from ar2dlm.armap.dpo_run import main\n"
        "class Kill(TrainerCallback):\n"
        "    def on_step_end(self, args, state, control, **kwargs):\n"
        "        if state.global_step == int(sys.argv[1]):\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "make = dpo.make_trainer\n"
        "def make_trainer(*a, **k):\n"
        "    trainer = make(*a, **k)\n"
        "    trainer.add_callback(Kill())\n"
        "    return trainer\n"
        "dpo.make_trainer = make_trainer\n"
        "main(sys.argv[2:])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, str(kill_at or -1), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def test_dlm_dpo_killed_or_stopped_resumes_from_its_last_checkpoint_to_the_uninterrupted_weights(models, tmp_path):
    """LoRA DPO of a DLM through dlm_dpo's command line: a segment that stops before its time limit
    exits 75 with a checkpoint, a job killed after its next periodic checkpoint loses only the
    steps since, and the rerun resumes there and ends at the weights of an uninterrupted run;
    an earlier result stays whole until the run completes."""
    from ar2dlm.provenance import read_json

    cfg = {
        "beta": 0.5,
        "steps": 6,
        "lr": 3e-3,
        "batch_size": 4,
        "grad_accum": 2,
        "max_length": 64,
        "train_pairs": None,
        "eval_pairs": None,
        "elbo_samples": 1,
        "eval_elbo_samples": 2,
        "checkpoint_every": 2,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
    }
    out, work = tmp_path / "resumed", tmp_path / "resumed.train"
    out.mkdir()
    (out / "earlier_result").write_text("kept until the run completes")
    stopped = _dpo_cli(models, tmp_path, out, cfg, launch={"stop_after_hours": 1e-9})
    assert stopped.returncode == 75 and "stopped after step 1 of 6" in stopped.stderr, stopped.stderr[-3000:]
    assert [p.name for p in work.glob("checkpoint-*")] == ["checkpoint-1"]
    killed = _dpo_cli(models, tmp_path, out, cfg, kill_at=3)  # resumes at 1, saves at 2, killed in 3
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [p.name for p in work.glob("checkpoint-*")] == ["checkpoint-2"] and (out / "earlier_result").is_file()
    scores = {p.name: p.stat().st_mtime_ns for p in work.glob("*.pt")}
    assert set(scores) == {"reference_scores.pt", "accuracy_before.pt"}
    done = _dpo_cli(models, tmp_path, out, cfg)
    assert done.returncode == 0, done.stderr[-3000:]
    info = read_json(out / "ar2dlm.json")
    assert info["resumed_from_step"] == 2 and not work.exists() and not (out / "earlier_result").exists()
    assert _dpo_cli(models, tmp_path, tmp_path / "straight", cfg).returncode == 0
    straight = read_json(tmp_path / "straight" / "ar2dlm.json")
    assert straight["resumed_from_step"] is None
    assert straight["reward_accuracy_before"] == info["reward_accuracy_before"]
    a, b = FolderWeights(out), FolderWeights(tmp_path / "straight")
    assert max(float((a[n].float() - b[n].float()).abs().max()) for n in a.names()) == 0.0
