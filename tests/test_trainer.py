"""The conversion training loop and its objectives on smoke-sized data."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from ar2dlm.core.models import build_qwen3, save_model
from ar2dlm.pipeline.config import merge_preset
from ar2dlm.pipeline.resolved import resolve
from ar2dlm.provenance import write_jsonl
from ar2dlm.training.objectives.distillation import on_policy_state, rollout_decoding, teacher_targets
from ar2dlm.training.teacher import ar_conventions
from ar2dlm.training.trainer import run_conventions, train_run
from tests.conftest import REPO
from tests.shared import TINY_ARCH, convert_argv, smoke_job, torchrun


@pytest.fixture(scope="module")
def setup(smoke_tokenizer, tmp_path_factory):
    tok, docs = smoke_tokenizer
    root = tmp_path_factory.mktemp("train")
    model = build_qwen3(TINY_ARCH, tok)
    save_model(model, tok, root / "teacher", {**ar_conventions(tok), "method": "test"})
    write_jsonl(root / "corpus.jsonl", docs)
    return root


def run_cfg(name, **training):
    run = resolve(merge_preset({"preset": "smoke"}, REPO / "config")).run(name).as_dict()
    run["training"].update(
        {
            "steps": 12,
            "batch_size": 8,
            "lr": 3e-3,
            "warmup_steps": 1,
            "checkpoint_every": 4,
            "seq_len": 64,
            "dtype": "fp32",
            **training,
        }
    )
    return run


def train(setup, run, out, seed=0, **job):
    return train_run(smoke_job(setup, run, out, seed, **job))


def log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize(
    "name,term",
    [
        ("mdlm", "diffusion"),
        ("ra", "align"),
        ("ed", "diffusion"),
        ("opd", "distill"),
        ("opd_off", "distill"),
        ("scratch", "diffusion"),
    ],
)
def test_each_objective_loss_falls(setup, tmp_path, name, term):
    run = run_cfg(name)
    info = train(setup, run, tmp_path / name)
    rows = log(tmp_path / name)
    assert len(rows) == 12 and all(term in r for r in rows)
    first, last = sum(r[term] for r in rows[:3]) / 3, sum(r[term] for r in rows[-3:]) / 3
    assert last < first, (name, first, last)
    assert info["checkpoints"] == [4, 8, 12]
    if name == "opd":  # on-policy: the prompts plus 8 rolled-out tokens per row are what a step trains on
        assert all(r["tokens"] > 8 * run["training"]["batch_size"] for r in rows)
    conv = json.loads((tmp_path / name / "step_12" / "ar2dlm.json").read_text())
    assert conv["attention"] == run["attention"] and conv["shift"] == run["shift"] and conv["run"] == name


def test_tensorboard_receives_every_logged_row(setup, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = run_cfg("mdlm", steps=4)
    train(
        setup, run, tmp_path / "run", tracking={"backend": "tensorboard", "project": "p", "directory": tmp_path / "tb"}
    )
    events = EventAccumulator(str(tmp_path / "tb" / "tiny" / "mdlm" / "seed0"))
    events.Reload()
    rows = log(tmp_path / "run")
    for key in ("loss", "diffusion", "lr", "grad_norm", "tokens_per_s"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows], key


def test_trainer_state_kept_for_the_last_checkpoints_and_bf16_weights_resume_exactly(setup, tmp_path):
    """keep_states 1: older checkpoints keep their weights, only the last its trainer state; weights
    exported in bf16 while the fp32 trainer state resumes a cut run to the uninterrupted weights."""
    import shutil

    from ar2dlm.core.models import load_model

    run = run_cfg("mdlm", steps=6, checkpoint_every=2, keep_states=1, export_dtype="bf16")
    info = train(setup, run, tmp_path / "straight")
    assert info["checkpoints"] == [2, 4, 6]
    assert [(tmp_path / "straight" / f"step_{k}" / "state").is_dir() for k in (2, 4, 6)] == [False, False, True]
    assert all(v.dtype == torch.bfloat16 for v in weights(tmp_path / "straight" / "step_6").values())
    assert load_model(tmp_path / "straight" / "step_6").info["dtype"] == "bf16"
    cut = tmp_path / "cut"
    train(setup, copy.deepcopy(run), cut)
    shutil.rmtree(cut / "step_6")  # the last checkpoint lost: nothing left to resume from but a fresh start
    assert train(setup, copy.deepcopy(run), cut)["resumed_from"] == 0
    kept = run_cfg("mdlm", steps=6, checkpoint_every=2, keep_states=3, export_dtype="bf16")
    train(setup, kept, tmp_path / "kept")
    shutil.rmtree(tmp_path / "kept" / "step_6")
    assert train(setup, copy.deepcopy(kept), tmp_path / "kept")["resumed_from"] == 4
    a, b = weights(tmp_path / "straight" / "step_6"), weights(tmp_path / "kept" / "step_6")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_activation_checkpointing_recomputes_the_same_gradients(setup, tmp_path):
    train(setup, run_cfg("ra", steps=3), tmp_path / "plain")
    train(setup, run_cfg("ra", steps=3, activation_checkpointing=True), tmp_path / "ac")
    plain, ac = log(tmp_path / "plain"), log(tmp_path / "ac")
    assert [r["loss"] for r in ac] == pytest.approx([r["loss"] for r in plain], rel=1e-6)
    assert [r["grad_norm"] for r in ac] == pytest.approx([r["grad_norm"] for r in plain], rel=1e-5)


def test_frozen_parameters_stay_bitwise_unchanged(setup, tmp_path):
    run = run_cfg("ra_freeze", steps=4)
    train(setup, run, tmp_path / "f")
    before, after = weights(setup / "teacher"), weights(tmp_path / "f" / "step_4")
    for name in before:
        frozen = "embed_tokens" in name or ".mlp." in name
        assert torch.equal(before[name], after[name]) == frozen, name


def test_repr_align_with_lambda_zero_matches_mdlm_and_loads_no_teacher(setup, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    a = run_cfg("ra", steps=4)
    a["align"]["lambda"] = 0.0
    b = run_cfg("mdlm", steps=4)
    loaded = []
    load = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM,
        "from_pretrained",
        lambda path, *args, **kw: loaded.append(str(path)) or load(path, *args, **kw),
    )
    train(setup, a, tmp_path / "a")
    assert loaded == [str(setup / "teacher")]  # the student's initial weights only, no frozen teacher
    train(setup, b, tmp_path / "b")
    wa, wb = weights(tmp_path / "a" / "step_4"), weights(tmp_path / "b" / "step_4")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


class EndsAtOnce(torch.nn.Module):
    """A student whose every decoded token is end-of-text."""

    def __init__(self, inner, eos):
        super().__init__()
        self.inner, self.eos = inner, eos

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits[..., self.eos] += 100.0
        return out


def test_opd_targets_come_from_the_teacher_on_x0(setup):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = run_cfg("opd")
    tok = AutoTokenizer.from_pretrained(str(setup / "teacher"))
    student = AutoModelForCausalLM.from_pretrained(str(setup / "teacher"))
    teacher = AutoModelForCausalLM.from_pretrained(str(setup / "teacher")).eval()
    conv = run_conventions(run, tok)
    prompts = [tok("def f(x):\n")["input_ids"], tok("Question: What is 2 + 3?\nAnswer:")["input_ids"]]

    decoding = rollout_decoding(run["distill"] | {"threshold": 0.9}, 8, conv)
    batch, _ = on_policy_state(student, conv, prompts, decoding, row_seeds=[0, 1])
    # the noisy state agrees with x0 wherever it is not masked, and each block keeps some masks
    keep = ~batch.masked & (batch.noisy != conv.mask_token_id)
    assert torch.equal(batch.noisy[keep], batch.clean[keep]) and batch.masked.any()
    # no loss position at or after a rollout's first end-of-text (divelab/OPDLM's rule)
    for row in range(len(prompts)):
        response = batch.clean[row, -8:]
        if (response == conv.eos_token_id).any():
            first = int((response == conv.eos_token_id).nonzero()[0]) + batch.clean.shape[1] - 8
            assert not batch.masked[row, first:].any()
    # a student that ends every rollout at once leaves nothing to distil
    ends = EndsAtOnce(student, conv.eos_token_id)
    assert not on_policy_state(ends, conv, prompts, decoding, row_seeds=[0, 1])[0].masked.any()
    targets, _ = teacher_targets(teacher, batch, batch.masked)  # projected at the masked positions only
    assert len(targets) == int(batch.masked.sum())
    for (row, i), target in zip(batch.masked.nonzero().tolist(), targets):
        prefix = batch.clean[row, :i][batch.valid[row, :i].bool()]
        with torch.no_grad():
            direct = teacher(input_ids=prefix[None]).logits[0, -1]
        torch.testing.assert_close(target, direct, atol=1e-4, rtol=1e-4)


KILL_SCRIPT = """
import sys, json
from ar2dlm.training.trainer import TrainJob, train_run
run, root, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
train_run(TrainJob(run, root + "/teacher", root + "/corpus.jsonl", out, seed=0, preset="smoke", model_name="tiny"))
"""


def test_kill_and_resume_matches_an_uninterrupted_run(setup, tmp_path):
    run = run_cfg("ra", steps=40, checkpoint_every=10)
    train(setup, run, tmp_path / "straight")
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, json.dumps(run), str(setup), str(out)],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    deadline = time.time() + 120
    while not (out / "step_10" / "trainer_state.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(int(p.name[5:]) for p in out.glob("step_*"))
    assert killed_at < 40  # it really was interrupted
    info = train(setup, copy.deepcopy(run), out)
    assert info["resumed_from"] == killed_at
    a, b = weights(tmp_path / "straight" / "step_40"), weights(out / "step_40")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in log(out)] == list(range(40))


def test_nan_loss_stops_without_overwriting_the_last_checkpoint(setup, tmp_path, monkeypatch):
    from ar2dlm.training.objectives.diffusion import Diffusion

    run = run_cfg("mdlm", steps=8)
    train(setup, run, tmp_path / "clean")
    real, calls = Diffusion.terms, []

    def poisoned(*args, **kwargs):  # the loss turns NaN at step 6
        calls.append(1)
        terms = real(*args, **kwargs)
        return {k: v * float("nan") for k, v in terms.items()} if len(calls) > 6 else terms

    monkeypatch.setattr(Diffusion, "terms", poisoned)
    with pytest.raises(FloatingPointError, match=r"step 6 .*last good checkpoint \(step 4\) is kept"):
        train(setup, run, tmp_path / "n")
    assert not (tmp_path / "n" / "step_8").exists()
    good, kept = weights(tmp_path / "clean" / "step_4"), weights(tmp_path / "n" / "step_4")
    assert all(torch.equal(good[k], kept[k]) for k in good)


DDP_SCRIPT = """
import json, sys
from ar2dlm.training.trainer import TrainJob, train_run
run, root, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
launch = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
print(json.dumps(train_run(TrainJob(run, root + "/teacher", root + "/corpus.jsonl", out, seed=0, preset="smoke",
                           model_name="tiny", launch=launch))))
"""


def test_two_process_fsdp_trains_and_resumes(setup, tmp_path):
    """torchrun with two CPU processes (gloo): the same script, FSDP2, per-rank masks, resumable."""
    import shutil

    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    run = run_cfg("ra", steps=6, checkpoint_every=3)
    cmd = [
        *torchrun(),
        str(script),
        json.dumps(run),
        str(setup),
        str(tmp_path / "ddp"),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    full = weights(tmp_path / "ddp" / "step_6")
    shutil.rmtree(tmp_path / "ddp" / "step_6")
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert '"resumed_from": 3' in again.stdout
    resumed = weights(tmp_path / "ddp" / "step_6")
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert set(full) == set(weights(setup / "teacher"))  # the consolidated weights, named as the model's


def _torchrun(tmp_path, setup, run, out, nproc=2, launch=None):
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    cmd = [
        *torchrun(nproc),
        str(script),
        json.dumps(run),
        str(setup),
        str(out),
        json.dumps(launch or {}),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("name", ["ra", "ed", "opd_off", "opd"])
def test_one_and_two_processes_train_on_the_same_masks(setup, tmp_path, name):
    """Masks and timesteps are drawn for the whole micro-batch on every process and the loss is
    normalised over the whole micro-batch: a 2-process FSDP2 run logs the losses of a 1-process run
    (with the frozen teacher sharded too, where the planner would shard it)."""
    run = run_cfg(name, steps=5, checkpoint_every=5)
    train(setup, run, tmp_path / "one")
    _torchrun(tmp_path, setup, run, tmp_path / "two", launch={"shard_teacher": name in ("ra", "opd_off")})
    one, two = log(tmp_path / "one"), log(tmp_path / "two")
    for key in ("loss", *(k for k in ("diffusion", "align", "distill") if k in one[0])):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], rel=1e-4), key
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]


def test_a_two_process_run_resumes_on_one_process(setup, tmp_path):
    """Checkpoints hold the consolidated weights and optimizer state and the shared mask stream:
    a 2-process run cut after its step-3 checkpoint continues on 1 process with the same losses."""
    import shutil

    run = run_cfg("mdlm", steps=6, checkpoint_every=3)
    _torchrun(tmp_path, setup, run, tmp_path / "two")
    shutil.copytree(tmp_path / "two", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "step_6")
    info = train(setup, copy.deepcopy(run), tmp_path / "cut")
    assert info["resumed_from"] == 3
    two, cut = log(tmp_path / "two"), log(tmp_path / "cut")
    assert [r["step"] for r in cut] == list(range(6))
    assert [r["loss"] for r in cut[3:]] == pytest.approx([r["loss"] for r in two[3:]], rel=1e-4)


@pytest.mark.parametrize("name,layout", [("mdlm", "packed"), ("mdlm", "documents"), ("opd_off", "packed")])
def test_pre_tokenised_rows_train_like_the_documents_they_come_from(setup, tmp_path, name, layout):
    """The token_rows rule's folder (the documents the objective selects, tokenised once) trains to
    the weights of the corpus file tokenised in the trainer, packed or one document per row."""
    from transformers import AutoTokenizer

    from ar2dlm.data.build import build_token_rows, rows_job
    from ar2dlm.data.token_rows import TokenRows
    from ar2dlm.methods.registry import objective_for, training_data
    from ar2dlm.training.trainer import training_batches

    run = run_cfg(name, steps=3, checkpoint_every=3, rows=layout)
    rows = tmp_path / "rows"
    selection = training_data(run, prompt_sets={})[1]
    build_token_rows(rows_job(setup / "corpus.jsonl", setup / "teacher", "subset", selection, 64), rows, workers=2)
    folder = TokenRows(rows)
    # one document per row: prompts stay clean and blocks start at the completion (as evaluated)
    assert folder.index["packed"] == (layout == "packed" and name == "mdlm")
    assert any(folder[i][1] > 0 for i in range(len(folder))) == (not folder.index["packed"])
    if layout == "documents":  # a conversion's complete documents are filled with end-of-text and trained on
        tok = AutoTokenizer.from_pretrained(str(setup / "teacher"))
        objective = objective_for(run, run_conventions(run, tok), 0)
        ids, valid, _ = training_batches(rows, objective, tok, 64, 8, 0).whole(0)
        ends = [(ids[i] == tok.eos_token_id).nonzero()[:, 0] for i in range(len(ids))]
        assert any(len(e) > 1 for e in ends)  # filled: the batch's longest row is longer
        for i, e in enumerate(ends):
            if len(e):
                assert (ids[i, int(e[0]) :] == tok.eos_token_id).all() and valid[i].all()
    train_run(replace(smoke_job(setup, copy.deepcopy(run), tmp_path / "disk"), corpus_path=rows))
    train(setup, copy.deepcopy(run), tmp_path / "file")
    a, b = weights(tmp_path / "disk" / "step_3"), weights(tmp_path / "file" / "step_3")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="holds rows of 64 tokens; the run trains on 32"):
        train_run(replace(smoke_job(setup, run_cfg(name, steps=3, seq_len=32), tmp_path / "bad"), corpus_path=rows))


def test_a_run_planned_in_segments_stops_with_a_checkpoint_and_its_retry_finishes(setup, tmp_path):
    """A job that would outlast its time limit checkpoints where it stands and exits 75; the retry
    resumes there and ends with the weights of an uninterrupted run."""
    from ar2dlm.training.convert_run import SEGMENT_DONE, main

    run = run_cfg("mdlm", steps=8, checkpoint_every=4)
    args = convert_argv(run, setup / "teacher", setup / "corpus.jsonl", tmp_path / "seg" / "train.json")
    from torch.distributed.run import get_args_parser  # the command line passes through torchrun's parser intact

    launched = get_args_parser().parse_args(["--nproc_per_node=2", "-m", "ar2dlm.training.convert_run", *args])
    assert launched.training_script_args == args
    with pytest.raises(SystemExit) as stop:
        main(args + ["--launch", json.dumps({"stop_after_hours": 1e-9})])
    assert stop.value.code == SEGMENT_DONE
    assert (tmp_path / "seg" / "step_1" / "trainer_state.pt").is_file() and not (
        tmp_path / "seg" / "train.json"
    ).exists()
    main(args)
    manifest = json.loads((tmp_path / "seg" / "train.json").read_text())
    assert manifest["resumed_from"] == 1 and manifest["stopped_at"] is None
    train(setup, copy.deepcopy(run), tmp_path / "whole")
    a, b = weights(tmp_path / "seg" / "step_8"), weights(tmp_path / "whole" / "step_8")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_process_fsdp_rolls_out_on_policy_and_keeps_frozen_parameters(setup, tmp_path):
    """On-policy distillation under FSDP2: each rank decodes its own prompts (a different number of
    forward passes) with the parameters gathered; frozen groups stay bitwise unchanged."""
    script = tmp_path / "fsdp.py"
    script.write_text(DDP_SCRIPT)
    run = run_cfg("opd", steps=3, checkpoint_every=3)
    run["freeze"] = ["embeddings", "mlp"]
    cmd = [
        *torchrun(),
        str(script),
        json.dumps(run),
        str(setup),
        str(tmp_path / "opd"),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(r["distill"] > 0 for r in log(tmp_path / "opd"))
    before, after = weights(setup / "teacher"), weights(tmp_path / "opd" / "step_3")
    for name in before:
        frozen = "embed_tokens" in name or ".mlp." in name
        assert torch.equal(before[name], after[name]) == frozen, name


def test_divergences():
    from ar2dlm.training.objectives.distillation import divergence

    torch.manual_seed(0)
    t, s = torch.randn(5, 11), torch.randn(5, 11)
    fwd = divergence(t, s, "forward_kl")
    ref = torch.nn.functional.kl_div(
        torch.log_softmax(s, -1), torch.log_softmax(t, -1), log_target=True, reduction="none"
    ).sum(-1)
    torch.testing.assert_close(fwd, ref)
    torch.testing.assert_close(divergence(t, s, "reverse_kl"), divergence(s, t, "forward_kl"))
    jsd = divergence(t, s, "jsd")
    torch.testing.assert_close(jsd, divergence(s, t, "jsd"))
    assert (jsd >= 0).all() and (jsd <= torch.log(torch.tensor(2.0)) + 1e-6).all()
    torch.testing.assert_close(divergence(t, s, top_k=11), fwd)  # all tokens kept = the full KL
    assert (divergence(t, t, "forward_kl").abs() < 1e-6).all() and (divergence(t, s, top_k=3) >= -1e-6).all()
    with pytest.raises(ValueError, match="unknown divergence"):
        divergence(t, s, "wasserstein")


def test_changed_settings_start_afresh_and_keep_the_old_checkpoints(setup, tmp_path):
    run = run_cfg("mdlm", steps=4)
    train(setup, run, tmp_path / "c")
    old = weights(tmp_path / "c" / "step_4")
    changed = copy.deepcopy(run)
    changed["training"]["lr"] = 1e-4
    info = train(setup, changed, tmp_path / "c")
    assert info["resumed_from"] == 0  # not resumed from checkpoints of other settings
    (archived,) = (tmp_path / "c" / "superseded").iterdir()
    assert all(torch.equal(old[k], weights(archived / "step_4")[k]) for k in old)
    assert not all(torch.equal(old[k], weights(tmp_path / "c" / "step_4")[k]) for k in old)


def test_checkpoints_without_their_own_settings_record_are_not_resumed(setup, tmp_path):
    # checkpoints whose run-level settings file was rewritten (say by an attempt that then failed)
    # still carry their own record: a checkpoint with none, or another, is archived, not resumed
    run = run_cfg("mdlm", steps=4)
    train(setup, run, tmp_path / "d")
    (tmp_path / "d" / "step_4" / "settings.json").unlink()
    info = train(setup, run, tmp_path / "d")
    assert info["resumed_from"] == 0 and len(list((tmp_path / "d" / "superseded").iterdir())) == 1
    assert (tmp_path / "d" / "step_4" / "settings.json").is_file()


def test_a_truncated_last_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(setup, tmp_path):
    run = run_cfg("mdlm", steps=6, checkpoint_every=2, keep_states=2)
    train(setup, run, tmp_path / "straight")
    out = tmp_path / "cut"
    train(setup, copy.deepcopy(run), out)
    weights_file = out / "step_6" / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[: weights_file.stat().st_size // 2])  # a truncated write
    info = train(setup, copy.deepcopy(run), out)
    assert info["resumed_from"] == 4
    (aside,) = (out / "corrupt").iterdir()  # moved, never deleted
    assert (
        aside.name.startswith("step_6-") and (aside / "model.safetensors").stat().st_size < weights_file.stat().st_size
    )
    a, b = weights(tmp_path / "straight" / "step_6"), weights(out / "step_6")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_corrupt_or_non_finite_weights_are_refused_naming_the_file(setup, tmp_path):
    from safetensors.torch import load_file, save_file

    from ar2dlm.core.models import CheckpointError, FolderWeights, load_model

    train(setup, run_cfg("mdlm", steps=2, checkpoint_every=2), tmp_path / "run")
    ckpt = tmp_path / "run" / "step_2"
    path = ckpt / "model.safetensors"
    good = path.read_bytes()
    path.write_bytes(good[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match the sha256"):
        load_model(ckpt)
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match the sha256"):
        FolderWeights(ckpt)
    # NaN weights, the recorded hash updated to match: refused by name all the same
    path.write_bytes(good)
    tensors = load_file(path)
    name = next(k for k in tensors if k.endswith("mlp.down_proj.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})
    conv = json.loads((ckpt / "ar2dlm.json").read_text())
    from ar2dlm.core.models import file_sha256

    conv["weights_sha256"]["model.safetensors"] = file_sha256(path)
    (ckpt / "ar2dlm.json").write_text(json.dumps(conv))
    with pytest.raises(CheckpointError, match=f"tensor {name} holds NaN"):
        load_model(ckpt)
    with pytest.raises(CheckpointError, match=f"tensor {name} holds NaN"):
        FolderWeights(ckpt)[name]


@pytest.mark.parametrize("name", ["mdlm", "ra_freeze", "ed", "opd"])
def test_flops_are_counted_per_part_and_add_up_in_the_manifest(setup, tmp_path, name):
    """Student forward and backward (4N + 2N_trainable per position, both copies of the 2L layout),
    the teacher's forward (2N_teacher per position) and on-policy rollouts (2N per position the
    decoding ran over), summed from the log into the manifest."""
    from ar2dlm.training.freezing import freeze

    run = run_cfg(name, steps=2, checkpoint_every=2)
    info = train(setup, run, tmp_path / name)
    rows = log(tmp_path / name)
    model = build_qwen3(TINY_ARCH, setup_tokenizer(setup))
    n = sum(p.numel() for p in model.parameters())
    freeze(model, run["freeze"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    block = 2 if run["attention"] == "block" else 1
    for r in rows:
        positions = r["flops_student"] / ((4 * n + 2 * trainable) * block)
        assert positions == int(positions) > 0
        teacher = r["flops_teacher"] / (2 * n)  # the teacher has the student's architecture here
        assert teacher == (positions if name in ("ra_freeze", "opd") else 0)
        assert (r["flops_rollout"] > 0) == (name == "opd")
    if name == "ra_freeze":
        assert trainable < n
    assert info["flops"]["total"] == pytest.approx(
        sum(r["flops_student"] + r["flops_teacher"] + r["flops_rollout"] for r in rows)
    )
    assert info["tokens"] == sum(r["tokens"] for r in rows)


def setup_tokenizer(setup):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(setup / "teacher"))


def test_a_staged_run_starts_from_its_source_runs_final_weights_and_counts_its_compute(setup, tmp_path):
    """``init: {run: NAME}``: the staged run starts from the source run's final weights (at learning
    rate 0 its checkpoint equals them bitwise, and they are not the teacher's), and the manifest adds
    the source's tokens and FLOPs; without the source's manifest it refuses."""
    from ar2dlm.core.models import checkpoint_dir
    from ar2dlm.provenance import write_json

    source = train(setup, run_cfg("ed", steps=4, checkpoint_every=4), tmp_path / "ed")
    write_json(tmp_path / "ed" / "train.json", source)
    staged = run_cfg("opd", steps=2, checkpoint_every=2, lr=0.0)  # lr 0: the weights stay the source's
    staged["init"] = {"run": "ed"}
    with pytest.raises(ValueError, match="give that run's manifest"):
        train(setup, staged, tmp_path / "refused")
    info = train(setup, staged, tmp_path / "opd", init_from=tmp_path / "ed" / "train.json")
    final_source = weights(checkpoint_dir(tmp_path / "ed", 4))
    started = weights(checkpoint_dir(tmp_path / "opd", 2))
    assert all(torch.equal(final_source[k], started[k]) for k in final_source)
    assert not all(
        torch.equal(final_source[k], weights(setup / "teacher")[k])
        for k in final_source
        if k in weights(setup / "teacher")
    )
    assert info["init"]["run"] == "ed" and info["tokens_with_init"] == info["tokens"] + source["tokens"]
    assert info["flops"]["with_init"] == pytest.approx(info["flops"]["total"] + source["flops"]["total"])


def test_staged_runs_are_checked_when_the_config_loads():
    from ar2dlm.pipeline.config import ConfigError

    cfg = merge_preset({"preset": "smoke"}, REPO / "config")
    cfg["runs"]["staged"] = {"method": "opdlm", "init": {"run": "ed"}}
    cfg["studies"]["staged"] = {"runs": ["staged"], "evals": ["synthetic_code"]}
    resolved = resolve(cfg)
    assert resolved.init_manifest("tiny", "staged", 1) == ["results/models/tiny/ed/seed1/train.json"]
    assert resolved.conversion_settings("staged")["init"]["settings"] == resolved.conversion_settings("ed")
    table_config = resolved.study_config("staged")  # what the study's table resolves its runs from
    assert set(table_config["runs"]) == {"staged", "ed"} and resolve(table_config).run("staged")["init"] == {
        "run": "ed"
    }
    cfg["runs"]["ed"]["init"] = {"run": "staged"}
    with pytest.raises(
        ConfigError, match=r"runs\.ed\.init\.run.*in a loop: ed -> staged -> ed"
    ):  # the first in config order
        resolve(cfg)
    cfg["runs"]["ed"]["init"] = {"run": "nope"}
    with pytest.raises(ConfigError, match="no such run 'nope'"):
        resolve(cfg)


class _ThreadRanks:
    """Ranks as threads, with the object collectives checkpoint hashing uses (every rank's object,
    rank 0's object), so each rank's share of the hashing can be watched."""

    def __init__(self, world):
        import threading

        self.world, self.barrier, self.slots, self.hashed = world, threading.Barrier(world), [None] * world, []

    def all_gathered(self, obj, pg):
        self.slots[pg.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def from_main(self, obj, pg):
        return self.all_gathered(obj, pg)[0]

    def run(self, monkeypatch, fn):
        """``fn(pg)`` on every rank at once; each rank's result, and which files each rank hashed."""
        import threading

        from ar2dlm.training import checkpointing
        from ar2dlm.training.distributed import ProcessGroup

        real = checkpointing.file_sha256
        monkeypatch.setattr(checkpointing, "all_gathered", self.all_gathered)
        monkeypatch.setattr(checkpointing, "from_main", self.from_main)
        monkeypatch.setattr(
            checkpointing,
            "file_sha256",
            lambda path: self.hashed.append((int(threading.current_thread().name), path.name)) or real(path),
        )
        results = [None] * self.world

        def rank(r):
            results[r] = fn(ProcessGroup(self.world, r))

        threads = [threading.Thread(target=rank, args=(r,), name=str(r)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results


def test_checkpoint_files_are_hashed_once_each_shared_by_the_ranks(setup, tmp_path, monkeypatch):
    """On save each rank hashes the state files it wrote (rank 0 also the metadata); on resume each
    hashes an even share of the checkpoint's files. Every rank reaches the same verdict, which
    names a corrupt state file."""
    from ar2dlm.training.checkpointing import checkpoint_problem, even_shares, written_state_hashes

    train(setup, run_cfg("mdlm", steps=2, checkpoint_every=2), tmp_path / "run")  # before the ranks are threads
    shares = even_shares({"a": 10, "b": 9, "c": 5, "d": 5, "e": 1}, 2)
    assert sorted(sum(shares, [])) == ["a", "b", "c", "d", "e"] and sorted(map(len, shares)) == [2, 3]
    assert max(sum({"a": 10, "b": 9, "c": 5, "d": 5, "e": 1}[n] for n in s) for s in shares) <= 30 / 2 + 10

    written = tmp_path / "written"
    for name in ("__0_0.distcp", "__1_0.distcp", "__1_1.distcp", ".metadata"):
        (written / "state").mkdir(parents=True, exist_ok=True)
        (written / "state" / name).write_bytes(name.encode())
    ranks = _ThreadRanks(2)
    a, b = ranks.run(monkeypatch, lambda pg: written_state_hashes(written, pg))
    assert a == b and set(a) == {f"state/{n}" for n in ("__0_0.distcp", "__1_0.distcp", "__1_1.distcp", ".metadata")}
    assert sorted(ranks.hashed) == [(0, ".metadata"), (0, "__0_0.distcp"), (1, "__1_0.distcp"), (1, "__1_1.distcp")]

    ckpt = tmp_path / "run" / "step_2"
    ranks = _ThreadRanks(2)
    assert ranks.run(monkeypatch, lambda pg: checkpoint_problem(ckpt, pg)) == [None, None]
    files = [name for _, name in ranks.hashed]
    assert sorted(files) == sorted({"model.safetensors", "__0_0.distcp", ".metadata"})
    assert {r for r, _ in ranks.hashed} == {0, 1}
    state = ckpt / "state" / "__0_0.distcp"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 1  # one flipped bit
    state.write_bytes(bytes(data))
    verdicts = _ThreadRanks(2).run(monkeypatch, lambda pg: checkpoint_problem(ckpt, pg))
    assert verdicts[0] == verdicts[1] and "__0_0.distcp does not match the sha256" in verdicts[0]
