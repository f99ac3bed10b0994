"""The GPU check: one script, offline, that exits non-zero when a CUDA path of the pipeline is broken.

    python benchmarks/gpu_check.py --out gpu_check.json                     # one GPU: at most 8 minutes
    python benchmarks/gpu_check.py --device cpu --quick --out check.json    # what a CPU runs (the tests)

It installs and downloads nothing: it runs in the environment it is given, with the Hugging Face hub
set offline, and stops before any work (exit 2) naming a package the environment lacks, or a CUDA
device it does not see. Every model starts from a small Qwen3 teacher written here (a byte-level BPE
tokenizer trained on the synthetic corpus, a few layers pretrained for a few steps on the CPU so that
its predictions depend on their context: ``SIZES``), so what it checks is that each path runs on the
device and computes what its reference computes, not model quality.

Each check is one assertion with its tolerance, judged twice: on the measured value and on that value
altered (numbers moved by half, tensors by a tenth of their spread, a token added, a bound's failing
side); a comparison that passes the altered value too could pass anything, and fails the check. The
table printed at the end (and ``--out``, as JSON) gives every check's PASS / FAIL / SKIP, the measured
values, the criterion, the verdict on the altered value (FAIL where the comparison can fail) and its seconds;
the exit status is 1 when any check fails or is not reached (an exception, a missing input, the
time budget spent). SKIP only on a CPU, for what a CPU cannot run (``Stage.cpu_skip``).

Stages, through the project's own entry points (``python -m ar2dlm.training.convert_run``,
``python -m ar2dlm.armap.dpo_run``, ``ar2dlm.armap.pipeline.search``):

- train: one conversion per method family (mdlm; repr_align, whose alignment reads the frozen
  teacher; efficient_dlm, block attention in the 2L layout; opdlm, on-policy distillation from the
  student's own rollouts), bf16 autocast on CUDA with flex attention (the trainer's choice there); on a
  CPU in the dtype it computes natively (``dtype: auto``: bf16 with AVX-512 BF16 or AMX, fp32 on an
  AVX2-only CPU, where bf16 is emulated: slower and rounded otherwise than the device kernels checked);
- resume: the mdlm run in a subprocess, SIGKILLed once its first checkpoint is written, resumed from
  the DCP trainer state and compared with the uninterrupted run;
- two_process: torchrun with two processes on gloo with CUDA hidden (NCCL refuses two ranks on one
  GPU and the trainer binds rank r to ``cuda:r``), FSDP2 sharded, against one process on the device;
  its step checkpoint resumed by one process on the device (DCP resharded 2 -> 1, CPU -> device);
- decode: the efficient_dlm checkpoint decoded with the exact block KV cache and without, in float64
  so cached and recomputed logits agree to ~1e-12 and the equality criterion of
  ``tests/test_sampling.py`` (the same tokens) is not at the mercy of near-ties; the decode engine's
  responses against those paths (the DLM) and transformers' generate (the teacher);
- decode_graphs: the engine compiled with CUDA graphs against the eager engine, token for token, for
  every conventions combination (causal; bidirectional and block, with and without the shift, blocks of
  1, 4 and 8) at the Qwen3-0.6B shape (fp32, random weights), and AR against transformers' generate; on a
  CPU the eager engine under a fake of CUDA graphs' output lifetimes (``tests.shared.GraphReplays``);
- decode_speed: tokens/s and milliseconds per forward kind of the engine's AR and block DLM at the
  Qwen3-0.6B shape (random weights, bf16, CUDA graphs), transformers' generate, and vLLM serving
  the same weights when it is installed (a skip line when not), against the weight-read bound;
- dpo: one LoRA DPO step through TRL on the AR teacher (AR-MAP's preference vector) and on the mdlm
  DLM (the ELBO DPO baseline);
- gamma: one gamma-search point merging that vector into the DLM;
- flex (CUDA only: flex attention has no CPU backward): the mdlm and efficient_dlm losses and their
  gradients through flex attention BlockMasks against dense masks (sdpa), in fp32;
- memory: a training step's measured peak (CUDA: ``torch.cuda.max_memory_allocated``; CPU: the
  process's peak resident size, ``benchmarks/train_memory.py``) against ``ar2dlm.plan.memory``.

What it cannot cover on one GPU: NCCL collectives, the placement of ranks on their own GPUs and
FSDP2's bf16 all-gathers on GPUs (the two-process case runs on gloo, on the host's CPU), several
nodes, and model sizes beyond the 0.6B shape of the memory cases.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # train_memory: the CPU memory measurement and its random Qwen3
from train_memory import WIDE  # noqa: E402  (the 768-wide CPU shape)

REQUIRED = ("torch", "transformers", "tokenizers", "safetensors", "datasets", "trl", "peft", "yaml", "ar2dlm")
BUDGET_S = 480  # the whole check on one H200

# Sizes: the check trains a 4-layer, 512-wide Qwen3 (head width 128, as every Qwen3; a 2,048-token
# vocabulary) on 8 rows of 256 tokens for 8 steps, its teacher pretrained for 100 steps on the CPU;
# --quick (the CPU test) a 2-layer, 64-wide one. The memory cases use the real Qwen3-0.6B widths
# (vocabulary 151,936) on CUDA, the 768-wide case of benchmarks/train_memory.py on a CPU.
SIZES = {
    "full": {
        "arch": {
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
        },
        "vocab": 2048,
        "seq_len": 256,
        "batch_size": 8,
        "steps": 8,
        "checkpoint_every": 4,
        "rollout_length": 32,
        "dpo_max_length": 128,
        "prompt_tokens": 24,
        "decode_blocks": 4,
        "pretrain": {"steps": 100, "batch_size": 8, "seq_len": 128, "lr": 3e-3},
    },
    "quick": {
        "arch": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
        },
        "vocab": 512,
        "seq_len": 64,
        "batch_size": 4,
        "steps": 6,
        "checkpoint_every": 2,
        "rollout_length": 8,
        "dpo_max_length": 64,
        "prompt_tokens": 12,
        "decode_blocks": 2,
        "pretrain": {"steps": 40, "batch_size": 8, "seq_len": 64, "lr": 3e-3},
    },
}
QWEN3_06B = "Qwen/Qwen3-0.6B-Base"
MEMORY_CASES = {  # (device, quick) -> cases: a method's run of the tiny preset at a shape, rows x seq
    ("cuda", False): [("efficient_dlm", QWEN3_06B, 2, 2048), ("repr_align", QWEN3_06B, 2, 2048)],
    ("cuda", True): [("efficient_dlm", QWEN3_06B, 1, 1024), ("repr_align", QWEN3_06B, 1, 1024)],
    ("cpu", False): [("efficient_dlm", WIDE, 2, 512)],
    ("cpu", True): [("efficient_dlm", WIDE, 2, 256)],
}
FAMILIES = {"mdlm": "mdlm", "repr_align": "ra", "efficient_dlm": "ed", "opdlm": "opd"}  # family -> tiny preset run
TERMS = {
    "mdlm": ("diffusion",),
    "repr_align": ("diffusion", "align"),
    "efficient_dlm": ("diffusion",),
    "opdlm": ("distill",),
}
# The first step's loss against fp32 on the CPU (same weights, batch and masks): bf16 autocast moved it
# by 1.5e-4 to 5.4e-4 on a CPU (the quick sizes). It catches a device run that computes something else
# (data, weights, dtype path); a subtly wrong mask moves a loss by less (flex: below). opdlm's first batch
# is its rollouts, argmax decisions of the untrained student that bf16 kernels may flip (another batch of
# the same student, not a wrong one): on a CPU bf16 moved its first loss by 1.1e-3 (quick) and 1.3e-4
# (full sizes, 3.8955 against 3.896), so it is held to 5%, a few flipped tokens of 256, and must fall as
# it trains: the mean loss of its last half of steps at most OPD_LOSS_FALL of its first (CPU, full sizes:
# 0.54 in fp32, 0.66 in bf16; quick 0.10; a student that does not learn stays near 1).
REFERENCED = ("mdlm", "repr_align", "efficient_dlm", "opdlm")
FIRST_LOSS_TOL = {"mdlm": 1e-2, "repr_align": 1e-2, "efficient_dlm": 1e-2, "opdlm": 5e-2}
OPD_LOSS_FALL = 0.85
FLEX_FAMILIES = ("efficient_dlm", "mdlm")  # the 2L block mask and the bidirectional one, with padding
# Resume on CPU: bitwise (the trainer's promise, tests/test_trainer.py). On CUDA, bf16 with atomics in
# some backward kernels: losses within 1% per step and the final weights within 5% of the training's own
# change (a resume that lost the mask stream moved them by 55% and 26% at the quick sizes).
RESUME_TOL = {"cpu": (0.0, 0.0), "cuda": (1e-2, 5e-2)}  # (loss relative, weights relative to their change)
# Two processes (gloo, CPU, fp32) against one on the device (fp32): CPU 1e-4 as tests/test_trainer.py;
# CUDA adds CPU-vs-GPU kernels (fp32, no TF32) compounded over the steps.
TWO_PROCESS_TOL = {"cpu": (1e-4, 1e-3), "cuda": (1e-3, 2e-2)}
# fp32: loss relative, gradients relative L2. A 2L mask letting noisy blocks see earlier noisy blocks moved
# them by 8e-4 and 0.16 (quick sizes, dense masks both sides); fp32 kernels differ by ~1e-7.
FLEX_TOL = (1e-4, 1e-3)
MEMORY_TOL = 0.25  # the planner's estimate within 25% of the measured peak
MERGE_TOL = 1e-5  # gamma merge against dlm + gamma * (dpo - teacher), fp32, absolute
TIMED_OUT = "not run: the time budget ({:.0f} s) was spent"


class Missing(RuntimeError):
    """An input a stage reads that an earlier stage did not produce."""


@dataclass
class Result:
    check: str
    stage: str
    status: str  # PASS, FAIL, SKIP
    measured: str
    criterion: str
    seconds: float
    # the check's comparison judged on its value altered (``Context.judge``): FAIL is what a comparison
    # able to fail gives; "" for a check that compares no value
    altered: str = ""


@dataclass
class Context:
    device: str
    quick: bool
    work: Path
    budget_s: float
    inject: str | None
    start: float = field(default_factory=time.time)
    results: dict = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)
    stage: str = ""
    stage_start: float = 0.0
    perturbed: set = field(default_factory=set)

    @property
    def sizes(self) -> dict:
        return SIZES["quick" if self.quick else "full"]

    def remaining(self) -> float:
        return self.budget_s - (time.time() - self.start)

    @property
    def train_dtype(self) -> str:
        """The training runs' dtype: bf16 on CUDA, what ``auto`` picks on a CPU (its native dtype)."""
        from ar2dlm.core.precision import resolve_dtype

        return "bf16" if self.device == "cuda" else resolve_dtype("auto", self.device)

    def need(self, key: str):
        if key not in self.artifacts:
            why = self.artifacts.get("prepare_error") or "an earlier stage did not produce it"
            raise Missing(f"not run: needs {key}: {why}")
        return self.artifacts[key]

    def expect(self, check: str, ok: bool, measured: str, criterion: str, altered: str = "") -> None:
        self.results[check] = Result(
            check,
            self.stage,
            "PASS" if ok else "FAIL",
            measured,
            criterion,
            round(time.time() - self.stage_start, 1),
            altered,
        )
        print(f"[{self.results[check].status}] {check}: {measured} ({criterion})", flush=True)

    def judge(
        self,
        check: str,
        value,
        compare: Callable[[object], tuple[bool, str]],
        criterion: str,
        altered: Callable | None = None,
    ) -> None:
        """Report ``check`` from ``compare(value)`` (whether it passes, what was measured), judged twice:
        on ``value`` and on ``value`` altered (``alter``). A comparison that passes the altered value too
        could pass anything, so the check fails; every run shows each comparison able to fail. With
        ``--inject-failure`` naming the check (or ``all``) the altered verdict is the check's."""
        ok, measured = compare(value)
        ok_altered, measured_altered = compare(alter(value, altered))
        if self.inject in (check, "all"):
            self.perturbed.add(check)
            ok, measured = ok_altered, measured_altered
        elif ok and ok_altered:
            ok, measured = False, f"{measured}; its comparison passes an altered value too ({measured_altered})"
        self.expect(check, ok, measured, criterion, "PASS" if ok_altered else "FAIL")

    def fail_unreported(self, checks, reason: str) -> None:
        for check in checks:
            if check not in self.results:
                self.results[check] = Result(
                    check, self.stage, "FAIL", "", reason, round(time.time() - self.stage_start, 1)
                )

    def guarded(self, checks, fn, *args) -> None:
        """``fn(*args)``; when it raises, those of ``checks`` it has not reported fail with the reason
        (the other checks of the stage still run)."""
        try:
            fn(*args)
            return
        except Missing as exc:
            reason = str(exc)
        except Exception as exc:
            traceback.print_exc()
            reason = describe(exc)
        self.fail_unreported(checks, reason)


def alter(value, altered: Callable | None = None):
    """``value`` altered so that a sound comparison of it fails: ``altered(value)`` where given (a bound's
    failing side), else tensors shifted by a tenth of their spread, numbers by half, token lists by one
    more token."""
    if altered is not None:
        return altered(value)
    import torch

    if isinstance(value, dict):
        return {k: v + 0.1 * (v.std() + 1e-3) if torch.is_floating_point(v) else v for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [[*value[0], -1], *value[1:]]  # the first response one (impossible) token longer
    if isinstance(value, list):
        return [x * 1.5 + 1.0 for x in value]
    return value * 1.5 + 1.0


def describe(exc: BaseException) -> str:
    """An exception in one line: its type, its message's first line and, for a long message (a
    subprocess's output), its last."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""
    return f"{type(exc).__name__}: {text}"[:400]


@dataclass(frozen=True)
class Stage:
    name: str
    checks: tuple[str, ...]
    run: Callable[[Context], None]
    needs: tuple[str, ...] = ()  # stages whose outputs it reads
    cpu_skip: str | None = None  # why a CPU cannot run it
    inputs: bool = True  # reads the tokenizer, corpus and teacher ``prepare`` writes


# ---------------------------------------------------------------------------------------------- inputs


def subprocess_env(**extra) -> dict:
    """This checkout first on the path, the hub offline (nothing is downloaded)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        **extra,
    }


def prepare(ctx: Context) -> None:
    """Tokenizer, corpus, preference pairs and the AR teacher (pretrained here on the CPU for a few steps, so
    its predictions depend on their context), written under ``work``."""
    from ar2dlm.data.code_suite import generate_code_suite
    from ar2dlm.data.corpus import suite_documents
    from ar2dlm.data.math_suite import generate_math_suite
    from ar2dlm.data.preferences import make_preferences
    from ar2dlm.data.tokenization import train_bpe_tokenizer
    from ar2dlm.provenance import write_jsonl
    from ar2dlm.training.teacher import TeacherJob, pretrain_teacher

    s = ctx.sizes
    code, _, _ = generate_code_suite(200 if ctx.quick else 400, 1, 0.2, 0)
    maths, _, _ = generate_math_suite(200 if ctx.quick else 400, 1, 0)
    docs = suite_documents(code, maths)
    tok = train_bpe_tokenizer((d["prompt"] + d["completion"] for d in docs), s["vocab"], ctx.work / "tokenizer")
    write_jsonl(ctx.work / "corpus.jsonl", docs)
    teacher = ctx.work / "teacher"
    pretrain = {
        **s["pretrain"],
        "warmup_steps": 10,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "dtype": "auto",
        "log_every": 10,
    }
    info = pretrain_teacher(
        TeacherJob({"arch": s["arch"], "pretrain": pretrain}, 0, "gpu_check"),
        ctx.work / "tokenizer",
        ctx.work / "corpus.jsonl",
        teacher,
        ctx.work / "teacher_loss.csv",
    )
    print(
        f"teacher: {info['parameters']} parameters, pretrained {s['pretrain']['steps']} steps on the CPU to loss "
        f"{info['data']['final_train_loss']}",
        flush=True,
    )
    pairs = make_preferences("math", maths, 8, 0, "train")
    write_jsonl(ctx.work / "prefs_train.jsonl", pairs[:4])
    write_jsonl(ctx.work / "prefs_eval.jsonl", pairs[4:])
    ctx.artifacts.update(teacher=teacher, corpus=ctx.work / "corpus.jsonl", tokenizer=tok, docs=docs)


def run_settings(ctx: Context, family: str, dtype: str) -> dict:
    """The tiny preset's run of ``family``, at this check's sizes."""
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    s = ctx.sizes
    run = resolve(merge_preset({"preset": "tiny"}, REPO / "config")).run(FAMILIES[family]).as_dict()
    run["training"].update(
        {
            "steps": s["steps"],
            "batch_size": s["batch_size"],
            "grad_accum": 1,
            "seq_len": s["seq_len"],
            "lr": 3e-3,
            "warmup_steps": 1,
            "dtype": dtype,
            "checkpoint_every": s["checkpoint_every"],
            "log_every": 1,
        }
    )
    if run["distill"] is not None:
        run["distill"].update({"rollout_length": s["rollout_length"], "curriculum": None})
    return run


def convert_argv(ctx: Context, run: dict, out: Path) -> list[str]:
    """``ar2dlm.training.convert_run``'s command line for ``run`` into ``out`` (its train.json)."""
    from tests.shared import convert_argv as argv

    return argv(run, ctx.need("teacher"), ctx.need("corpus"), out / "train.json", "gpu_check", "random_qwen3")


def convert(ctx: Context, run: dict, out: Path) -> dict:
    """One conversion through the trainer's command line, in this process; returns its manifest."""
    from ar2dlm.provenance import read_json
    from ar2dlm.training.convert_run import main

    main(convert_argv(ctx, run, out))
    return read_json(out / "train.json")


def run_log(out: Path) -> list[dict]:
    from ar2dlm.provenance import read_jsonl

    return read_jsonl(out / "log.jsonl")


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}


def final_weights(out: Path) -> dict:
    from ar2dlm.core.models import final_checkpoint

    return weights(final_checkpoint(out / "train.json"))


def max_rel(a: list[float], b: list[float]) -> float:
    """Largest relative difference of two equally long series (inf when their lengths differ)."""
    if len(a) != len(b):
        return math.inf
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)


def weights_rel(a: dict, b: dict, init: dict) -> float:
    """||a - b|| / ||b - init|| over all tensors: how far two trained models are apart, relative to
    how far training moved them."""
    import torch

    if set(a) != set(b):
        return math.inf
    diff = math.sqrt(sum(float((a[k] - b[k]).double().pow(2).sum()) for k in a))
    moved = math.sqrt(sum(float((b[k] - init[k]).double().pow(2).sum()) for k in b if k in init))
    return 0.0 if diff == 0 else diff / max(moved, float(torch.finfo(torch.float32).tiny))


def relative_within(value: float, tol: float) -> bool:
    return value == 0.0 if tol == 0.0 else value <= tol


# ---------------------------------------------------------------------------------------------- stages


def train_stage(ctx: Context) -> None:
    """One conversion per family, in ``ctx.train_dtype``, through the trainer's command line."""
    try:
        reference = reference_losses(ctx)
    except Exception as exc:  # the device runs still go ahead: the stages after them read their checkpoints
        traceback.print_exc()
        reference = {f: f"the fp32 CPU reference failed ({describe(exc)})" for f in REFERENCED}
    for family in FAMILIES:
        ctx.guarded((f"train_{family}",), train_family, ctx, family, reference.get(family))
    ctx.guarded(("on_policy_rollouts",), check_rollouts, ctx)


def train_family(ctx: Context, family: str, reference: float | str | None) -> None:
    out = ctx.work / "train" / family
    run = run_settings(ctx, family, ctx.train_dtype)
    info = convert(ctx, run, out)
    ctx.artifacts[f"run:{family}"] = (run, out)
    check_training(ctx, family, info, out, run, reference)


def rollout_token_bounds(run: dict, trained_tokens: int) -> tuple[int, int]:
    """Positions an on-policy step's rollouts run through the student, at least and at most: every
    prompt and generated token once (the step's trained tokens), and at most each row's prompt (up to
    a row, ``seq_len`` - 1) prefilled once and, per block of ``block_size``, one step per token, each
    running the block and the first one the finished block before it (``core.sampling.generate_dlm``)."""
    tr, block = run["training"], run["block_size"]
    length = run["distill"]["rollout_length"]
    return trained_tokens, tr["batch_size"] * (tr["seq_len"] - 1 + length * (1 + block))


def check_rollouts(ctx: Context) -> None:
    run, out = ctx.need("run:opdlm")
    log = run_log(out)
    params = sum(t.numel() for t in final_weights(out).values())  # tied weights once, as the FLOP count
    # the rollout FLOPs the trainer logs are 2 x parameters x positions run through the student
    bounds = [rollout_token_bounds(run, r["tokens"]) for r in log]
    finite = all(math.isfinite(r["distill"]) for r in log)

    def compare(positions):
        ok = all(lo <= p <= hi for p, (lo, hi) in zip(positions, bounds)) and finite
        return ok, f"{len(log)} steps, rollout positions per step " + ", ".join(
            f"{p:.0f} in [{lo}, {hi}]" for p, (lo, hi) in zip(positions, bounds)
        )

    ctx.judge(
        "on_policy_rollouts",
        [r["flops_rollout"] / (2 * params) for r in log],
        compare,
        "each opdlm step's rollout FLOPs / (2 x parameters) within the positions its sampler can run "
        "(its prompts and tokens once; at most block_size steps a block), and its distill term finite",
        altered=lambda ps: [p + hi for p, (_, hi) in zip(ps, bounds)],  # a count that runs past the bound
    )


def reference_losses(ctx: Context) -> dict[str, float]:
    """The first step's loss of each family with a reference (``REFERENCED``) in fp32 on the CPU, eager
    attention: the same weights, batch and masks (drawn on the CPU) as the device's first step."""
    runs = {f: run_settings(ctx, f, "fp32") for f in REFERENCED}
    for run in runs.values():
        run["training"]["steps"] = 1
    argvs = [convert_argv(ctx, run, ctx.work / "reference" / f) for f, run in runs.items()]
    if ctx.device == "cpu":
        from ar2dlm.training.convert_run import main

        for argv in argvs:
            main(argv)
    else:  # a CPU process beside this one's GPU
        script = (
            "import json, sys\nfrom ar2dlm.training.convert_run import main\nfor a in json.loads(sys.argv[1]): main(a)"
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, json.dumps(argvs)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=max(30.0, ctx.remaining()),
            env=subprocess_env(CUDA_VISIBLE_DEVICES=""),
        )
        if proc.returncode:
            raise RuntimeError(f"the CPU reference runs failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {f: run_log(ctx.work / "reference" / f)[0]["loss"] for f in runs}


def check_training(ctx: Context, family: str, info: dict, out: Path, run: dict, reference: float | str | None) -> None:
    """A run's log, checkpoint and dtype; its first loss against the fp32 CPU reference (a number, or
    why there is none) where the family has one."""
    from ar2dlm.core.models import final_checkpoint, load_model

    log = run_log(out)
    steps = run["training"]["steps"]
    finite = all(math.isfinite(r[t]) for r in log for t in ("loss", "grad_norm", *TERMS[family]))
    load_model(final_checkpoint(out / "train.json"), device="cpu")  # its recorded sha256 and finite weights
    init, trained = weights(ctx.need("teacher")), final_weights(out)
    moved = max(float((trained[k] - init[k]).abs().max()) for k in init if k in trained)
    dtype = info["versions"]["machine"].get("dtype")
    sound = [r["step"] for r in log] == list(range(steps)) and finite and moved > 0 and dtype == ctx.train_dtype
    terms = "+".join(TERMS[family])
    criterion = f"{steps} logged steps; loss, grad norm and {terms} finite; weights moved; {ctx.train_dtype}"
    late = [r["loss"] for r in log[len(log) // 2 :]]
    if family in REFERENCED:
        criterion += f"; first loss within {FIRST_LOSS_TOL[family]:g} relative of fp32 on the CPU"
    if family == "opdlm":  # on-policy: each step's batch is its own rollouts, so the loss must fall
        criterion += f"; mean loss of the last {len(late)} steps at most {OPD_LOSS_FALL:g} of the first"

    def compare(first: float) -> tuple[bool, str]:
        ok = sound
        measured = f"{len(log)} steps, loss {first:.4f} -> {log[-1]['loss']:.4f}, max |dW| {moved:.2e}, {dtype}"
        if family in REFERENCED:
            if isinstance(reference, str) or reference is None:
                ok, measured = False, f"{measured}; {reference or 'no fp32 CPU reference'}"
            else:
                diff = abs(first - reference) / abs(reference)
                ok = ok and diff <= FIRST_LOSS_TOL[family]
                measured += f"; fp32 CPU first loss {reference:.4f} ({diff:.1e})"
        if family == "opdlm":
            fall = sum(late) / len(late) / first
            ok = ok and fall <= OPD_LOSS_FALL
            measured += f"; last {len(late)} steps' mean / first {fall:.2f}"
        return ok, measured

    ctx.judge(f"train_{family}", log[0]["loss"], compare, criterion)


def resume_stage(ctx: Context) -> None:
    """The mdlm run killed after its first checkpoint and resumed, against the uninterrupted run."""
    run, straight = ctx.need("run:mdlm")
    out = ctx.work / "resume" / "killed"
    steps, first = run["training"]["steps"], run["training"]["checkpoint_every"]
    killed_at = kill_after_checkpoint(ctx, run, out, first)
    info = convert(ctx, run, out)
    loss_tol, weight_tol = RESUME_TOL[ctx.device]
    straight_losses = [r["loss"] for r in run_log(straight)]
    ok = info["resumed_from"] == killed_at and [r["step"] for r in run_log(out)] == list(range(steps))

    def compare_losses(resumed):
        loss_diff = max_rel(resumed, straight_losses)
        return ok and relative_within(loss_diff, loss_tol), (
            f"killed after step {killed_at} of {steps}, resumed from {info['resumed_from']}, "
            f"max loss difference {loss_diff:.2e}"
        )

    ctx.judge(
        "resume_losses",
        [r["loss"] for r in run_log(out)],
        compare_losses,
        f"resumes from the checkpoint it was killed after; every step logged once; losses within "
        f"{'bitwise' if loss_tol == 0 else f'{loss_tol:g} relative'} of the uninterrupted run",
    )
    want, init = final_weights(straight), weights(ctx.need("teacher"))

    def compare_weights(got):
        diff = weights_rel(got, want, init)
        return relative_within(diff, weight_tol), f"relative difference {diff:.2e}"

    ctx.judge(
        "resume_weights",
        final_weights(out),
        compare_weights,
        "final weights "
        + ("bitwise equal to" if weight_tol == 0 else f"within {weight_tol:g} of the training's change of")
        + " the uninterrupted run's",
    )


def kill_after_checkpoint(ctx: Context, run: dict, out: Path, step: int) -> int:
    """Run ``run`` in a subprocess, SIGKILL it once the trainer state of ``step`` is written (checkpoints
    appear whole: the trainer renames a finished folder into place); return its last resumable step."""
    from ar2dlm.core.models import checkpoint_dirs

    out.mkdir(parents=True, exist_ok=True)
    marker = out / f"step_{step}" / "trainer_state.pt"
    with open(out.parent / "killed.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ar2dlm.training.convert_run", *convert_argv(ctx, run, out)],
            cwd=REPO,
            env=subprocess_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + max(60.0, ctx.remaining())
        while not marker.exists() and proc.poll() is None:
            if time.time() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"no checkpoint of step {step} within the time budget")
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        code = proc.wait()
    if code != -signal.SIGKILL:
        tail = (out.parent / "killed.log").read_text()[-2000:]
        raise RuntimeError(f"the run to kill ended by itself (exit {code}) before it could be killed:\n{tail}")
    done = [k for k, p in checkpoint_dirs(out).items() if (p / "trainer_state.pt").is_file()]
    if not done or max(done) >= run["training"]["steps"]:
        raise RuntimeError(f"killed with checkpoints {sorted(done)} of {run['training']['steps']} steps: not mid-run")
    return max(done)


def two_process_stage(ctx: Context) -> None:
    """torchrun, two CPU processes on gloo (FSDP2), against one process on the device; the two-process
    checkpoint resumed by one process on the device."""
    from tests.shared import torchrun

    run = run_settings(ctx, "mdlm", "fp32")
    root = ctx.work / "two_process"
    two, one, cut = root / "two", root / "one", root / "cut"
    threads = str(max(1, (os.cpu_count() or 2) // 2))
    cmd = [
        *torchrun(),
        "-m",
        "ar2dlm.training.convert_run",
        *convert_argv(ctx, run, two),
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=max(30.0, ctx.remaining()),
        env=subprocess_env(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=threads),
    )
    if proc.returncode:
        raise RuntimeError(f"torchrun with two processes failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    convert(ctx, run, one)
    loss_tol, weight_tol = TWO_PROCESS_TOL[ctx.device]
    one_losses = [r["loss"] for r in run_log(one)]

    def compare_losses(two_losses):
        diff = max_rel(two_losses, one_losses)
        return relative_within(diff, loss_tol), f"max loss difference {diff:.2e}"

    ctx.judge(
        "two_process_equals_one",
        [r["loss"] for r in run_log(two)],
        compare_losses,
        f"two gloo processes (FSDP2, fp32) log the losses of one process on {ctx.device} within {loss_tol:g} relative",
    )
    k, steps = run["training"]["checkpoint_every"], run["training"]["steps"]
    shutil.copytree(two, cut)
    (cut / "train.json").unlink()
    for step in range(k + 1, steps + 1):
        shutil.rmtree(cut / f"step_{step}", ignore_errors=True)
    info = convert(ctx, run, cut)
    loss_diff = max_rel([r["loss"] for r in run_log(cut)][k:], one_losses[k:])
    want, init = final_weights(one), weights(ctx.need("teacher"))

    def compare_resumed(got):
        w_diff = weights_rel(got, want, init)
        return info["resumed_from"] == k and loss_diff <= loss_tol and w_diff <= weight_tol, (
            f"resumed from {info['resumed_from']}, max loss difference {loss_diff:.2e}, weights {w_diff:.2e}"
        )

    ctx.judge(
        "two_process_resumes_on_one",
        final_weights(cut),
        compare_resumed,
        f"the two-process checkpoint of step {k} resumes on one process on {ctx.device}: losses within "
        f"{loss_tol:g}, final weights within {weight_tol:g} of the training's change, of one process's run",
    )


def decode_stage(ctx: Context) -> None:
    """The efficient_dlm checkpoint decoded with the block KV cache and without, and through the
    decode engine; the teacher through the engine and transformers' generate (float64)."""
    import torch

    from ar2dlm.core.engine import DecodeEngine
    from ar2dlm.core.models import final_checkpoint, load_model
    from ar2dlm.core.sampling import Decoding, generate_ar, generate_dlm

    _, out = ctx.need("run:efficient_dlm")
    model, tok, conv, _ = load_model(final_checkpoint(out / "train.json"), dtype=torch.float64, device=ctx.device)
    s = ctx.sizes
    prompts = [tok(d["prompt"])["input_ids"][-s["prompt_tokens"] :] for d in ctx.need("docs")[::97][:4]]
    length = s["decode_blocks"] * conv.block_size
    full = Decoding(length, conv.block_size, threshold=0.9, stop_at_eos=False)
    cached, with_cache = generate_dlm(model, conv, prompts, full)
    plain, without = generate_dlm(model, conv, prompts, replace(full, use_cache=False))
    fewer = with_cache.forward_tokens < without.forward_tokens

    def compare_cached(tokens):
        same = sum(a == b for x, y in zip(tokens, plain) for a, b in zip(x, y))
        return tokens == plain and fewer, (
            f"{same} of {sum(map(len, plain))} tokens equal; forward tokens {with_cache.forward_tokens} cached, "
            f"{without.forward_tokens} recomputed ({len(prompts)} prompts, {length} tokens, block "
            f"{conv.block_size}, fp64)"
        )

    ctx.judge(
        "decode_block_cache",
        cached,
        compare_cached,
        "the same tokens with the exact block KV cache as with full recomputation, with fewer positions run",
    )
    to_eos = replace(full, stop_at_eos=True)
    engine_dlm = DecodeEngine(model, conv).generate(prompts, to_eos)[0]
    want_dlm = generate_dlm(model, conv, prompts, to_eos)[0]
    teacher = load_model(ctx.need("teacher"), dtype=torch.float64, device=ctx.device)
    ar_conv = teacher.conventions
    engine_ar = DecodeEngine(teacher.model, ar_conv).generate(prompts, Decoding(length))[0]
    want_ar = generate_ar(teacher.model, teacher.tokenizer, prompts, Decoding(length), batch_size=len(prompts))

    def compare_engine(dlm):
        return dlm == want_dlm and engine_ar == want_ar, (
            f"DLM {sum(a == b for a, b in zip(dlm, want_dlm))} of {len(prompts)} responses equal to the "
            f"DynamicCache path's, AR {sum(a == b for a, b in zip(engine_ar, want_ar))} of {len(prompts)} equal "
            "to transformers' generate (fp64, to end-of-text)"
        )

    ctx.judge(
        "decode_engine",
        engine_dlm,
        compare_engine,
        "the decode engine's greedy responses equal those of the paths it replaced",
    )


def decode_speed_stage(ctx: Context) -> None:
    """Decoding speed at the Qwen3-0.6B shape (random weights; --quick: the check's small shape):
    the engine's AR and block DLM (bf16 on CUDA, compiled with CUDA graphs), transformers'
    generate, and vLLM when it is installed, against the weight-read bound of the device."""
    from ar2dlm.core.conventions import Conventions
    from ar2dlm.core.engine import DecodeEngine
    from ar2dlm.core.sampling import Decoding, generate_ar

    model, arch = speed_model(ctx)
    device = next(model.parameters()).device
    prompt, new = list(range(11, 11 + SPEED["prompt"])), SPEED["new_tokens"]
    ar = Conventions("causal", True, 3, 1, 2)
    dlm = Conventions("block", False, 3, 1, 2, SPEED["block"])
    cuda = ctx.device == "cuda"

    rows, kinds = {}, {}
    engines = {
        "engine_ar": (DecodeEngine(model, ar, compile=cuda), {}),
        "engine_dlm": (DecodeEngine(model, dlm, compile=cuda), {"steps_per_block": SPEED["steps_per_block"]}),
    }
    for name, (engine, kw) in engines.items():
        decoding = Decoding(new, stop_at_eos=False, **kw)
        engine.generate([prompt], decoding)  # compiles (CUDA graphs are captured here)
        rows[name] = median_tokens_per_s(lambda e=engine, d=decoding: e.generate([prompt], d), new, device)
        engine.time_kinds = True
        kinds[name] = engine.generate([prompt], decoding)[1].ms_per_forward()
    full = Decoding(new, stop_at_eos=False)
    rows["hf_generate"] = median_tokens_per_s(
        lambda: generate_ar(model, SpeedTok, [prompt], full, batch_size=1), new, device
    )
    rows["vllm"], vllm_note = vllm_tokens_per_s(ctx, model, prompt, new)
    weight_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    bandwidth = copy_bandwidth_gbs(device)
    bound_ms = 1e3 * weight_gb / bandwidth
    producing = all(v and v > 0 for k, v in rows.items() if k != "vllm")

    def compare(fastest_ms):
        return fastest_ms >= bound_ms and producing, (
            f"{arch}: tokens/s "
            + ", ".join(f"{k} {v:.0f}" if v else f"{k} -" for k, v in rows.items())
            + f"; ms per forward {kinds} (fastest {fastest_ms:.3f}); weights {weight_gb:.2f} GB at {bandwidth:.0f} "
            f"GB/s copy bandwidth: {bound_ms:.3f} ms bound; DLM {SPEED['block'] // SPEED['steps_per_block']} "
            f"tokens per forward; {vllm_note}"
        )

    ctx.judge(
        "decode_speed",
        min(v for k in kinds.values() for v in k.values()),
        compare,
        "every forward timed no faster than reading the weights once allows (a timer that misses the "
        "device's work reads faster), every decoder producing tokens",
        altered=lambda v: bound_ms / 2,  # faster than the weights' read
    )


# The decode_graphs stage: every conventions combination the engine decodes (attention, shift, block
# size; tests.shared.GRAPHED), two prompts in a batch of three (one row of batch padding), 32
# new tokens. Random weights with the final norm scaled by GRAPH_SHARPEN: greedy picks far from ties, so
# fp32 kernels (compiled against eager) pick the same tokens and a wrong step shows as another token.
GRAPH_SHARPEN = 60.0


class SpeedTok:  # the two ids transformers' generate reads, for the random-weight models of the decode stages
    eos_token_id, pad_token_id = 1, 2


def decode_graphs_stage(ctx: Context) -> None:
    """What a GPU evaluation decodes: the engine compiled with CUDA graphs (``mode="reduce-overhead"``, each
    step's outputs reused by the next replay) against the eager engine, token for token, for every
    conventions combination at the Qwen3-0.6B shape (fp32, random weights); AR also against transformers'
    generate. On a CPU the eager engine runs under ``tests.shared.GraphReplays`` instead (each step's
    outputs overwritten when the next one runs), as the unit tests do. The first call of each combination
    compiles and captures; its seconds are printed."""
    import torch

    from ar2dlm.core.conventions import Conventions
    from ar2dlm.core.engine import DecodeEngine
    from ar2dlm.core.sampling import Decoding, generate_ar
    from tests.shared import GRAPHED, GraphReplays

    model, arch = speed_model(ctx, torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(GRAPH_SHARPEN)
    prompts, batch = [list(range(11, 51)), list(range(60, 135))], 3
    cuda, got, want, compile_s = ctx.device == "cuda", [], [], {}
    for attention, shift, bs in GRAPHED:
        conv = Conventions(attention, shift, 3, 1, 2, bs)
        decoding = Decoding(32, 8 if attention == "bidirectional" else None, use_cache=attention == "block")
        decoding = replace(decoding, stop_at_eos=False)
        want += DecodeEngine(model, conv).generate(prompts, decoding, batch_size=batch)[0]
        name = f"{attention}{'-shift' if shift else ''}{f'-{bs}' if bs else ''}"
        if cuda:
            engine = DecodeEngine(model, conv, compile=True)
            t0 = time.perf_counter()
            engine.generate(prompts, decoding, batch_size=batch)  # compiles and captures each step kind
            compile_s[name] = round(time.perf_counter() - t0, 1)
            got += engine.generate(prompts, decoding, batch_size=batch)[0]  # graph replays
        else:
            with GraphReplays():
                got += DecodeEngine(model, conv).generate(prompts, decoding, batch_size=batch)[0]
    plain = Decoding(32, stop_at_eos=False)

    hf_ar = generate_ar(model, SpeedTok, prompts, plain, batch_size=batch)
    print(f"decode_graphs: first call (compile and capture) seconds {compile_s or 'none (CPU)'}", flush=True)

    def compare(responses):
        same = sum(a == b for a, b in zip(responses, want))
        return responses == want and hf_ar == want[:2], (
            f"{arch}: {same} of {len(want)} responses ({len(GRAPHED)} conventions x {len(prompts)} prompts) equal "
            f"to the eager engine's; AR equal to transformers' generate: {hf_ar == want[:2]}; compile and capture "
            f"seconds {compile_s or '- (CPU: the graph fake)'}"
        )

    ctx.judge(
        "decode_graphed",
        got,
        compare,
        "the engine as a GPU evaluation runs it (CUDA graphs) decodes the eager engine's tokens for every "
        "conventions combination, and AR transformers' generate's",
    )


# The decode_speed stage: a 128-token prompt, 64 new tokens; the DLM decodes blocks of 32 in 8 steps
# (4 tokens per forward: random weights have no confidence to threshold).
SPEED = {"prompt": 128, "new_tokens": 64, "block": 32, "steps_per_block": 8}


def speed_model(ctx: Context, dtype=None):
    """A Qwen3 of random weights at the 0.6B shape (--quick: the check's small one), in ``dtype`` (default
    bf16 on CUDA, fp32 on a CPU)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if ctx.quick:
        a = ctx.sizes["arch"]
        shape = dict(a, head_dim=a["hidden_size"] // a["num_attention_heads"], vocab_size=ctx.sizes["vocab"])
        name = f"{a['hidden_size']}-wide, {a['num_hidden_layers']} layers"
    else:
        from ar2dlm.plan.memory import QWEN3_SHAPES

        shape, name = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"].config_dict(), "Qwen3-0.6B shape"
    shape = {**shape, "max_position_embeddings": 1024, "eos_token_id": 1, "pad_token_id": 2}
    torch.manual_seed(0)
    dtype = dtype or (torch.bfloat16 if ctx.device == "cuda" else torch.float32)
    model = Qwen3ForCausalLM(Qwen3Config(**shape)).to(dtype=dtype, device=ctx.device).eval()
    return model, f"{name}, {str(dtype).removeprefix('torch.')}"


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_tokens_per_s(fn, tokens: int, device, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return tokens / sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(device, gb: float = 0.5) -> float:
    """The device's memory bandwidth as a large copy achieves it (read + write)."""
    import torch

    x = torch.empty(int(gb * 1e9) // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(3):
        _sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * gb / min(times)


def vllm_tokens_per_s(ctx: Context, model, prompt: list[int], new: int) -> tuple[float | None, str]:
    """The same weights served by vLLM (CUDA graphs, greedy, batch 1), when vLLM is installed."""
    if ctx.device != "cuda" or importlib.util.find_spec("vllm") is None:
        why = "vllm is not installed" if importlib.util.find_spec("vllm") is None else "vLLM needs a GPU"
        return None, f"vLLM skipped: {why}"
    try:  # a vLLM built for another torch or CUDA imports and then fails: a skip line, not this check's failure
        from vllm import LLM, SamplingParams

        folder = ctx.work / "speed_model"
        model.save_pretrained(str(folder))
        llm = LLM(model=str(folder), skip_tokenizer_init=True, dtype="bfloat16", gpu_memory_utilization=0.3, seed=0)
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False)
    except Exception as exc:
        return None, f"vLLM skipped: installed but unusable here ({describe(exc)})"

    def run():
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)

    run()
    rate = median_tokens_per_s(run, new, next(model.parameters()).device)
    return rate, f"vLLM {rate:.0f} tokens/s (the engine's process keeps vLLM's memory: this stage runs last)"


# two optimizer steps: the first at learning rate 0 (TRL's warm-up starts there), the second large enough that
# the trained policy's log-probabilities differ from the base's by more than bf16 rounds (DPO_LOGPS_TOL)
DPO_SETTINGS = {
    "beta": 0.1,
    "steps": 2,
    "lr": 1e-2,
    "batch_size": 2,
    "train_pairs": 4,
    "eval_pairs": 4,
    "elbo_samples": 1,
    "eval_elbo_samples": 2,
    "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
}


def dpo_stage(ctx: Context) -> None:
    """LoRA DPO through TRL (the dpo_run command line) on the AR teacher and on the mdlm DLM."""
    ctx.guarded(("dpo_lora_teacher",), dpo_step, ctx, "dpo_lora_teacher", "--model", ctx.need("teacher"))
    ctx.guarded(
        ("dpo_lora_dlm",), lambda: dpo_step(ctx, "dpo_lora_dlm", "--manifest", ctx.need("run:mdlm")[1] / "train.json")
    )


def dpo_step(ctx: Context, check: str, flag: str, source: Path) -> None:
    from ar2dlm.armap.dpo_run import main
    from ar2dlm.core.models import final_checkpoint

    out = ctx.work / "dpo" / check
    cfg = {**DPO_SETTINGS, "max_length": ctx.sizes["dpo_max_length"]}
    from tests.shared import dpo_argv

    main(dpo_argv((flag, source), ctx.work / "prefs_train.jsonl", ctx.work / "prefs_eval.jsonl", cfg, out))
    check_lora_step(ctx, check, out, final_checkpoint(source) if flag == "--manifest" else source)
    ctx.artifacts[check] = out


def check_lora_step(ctx: Context, check: str, out: Path, base: Path) -> None:
    """A merged LoRA step moved the linear layers only: the embeddings keep the base's values as DPO
    loaded them (fp32, or rounded to bf16 for LoRA on a GPU: ``ar2dlm.armap.dpo.train_dpo``). For a
    causal model, the held-out log-probabilities TRL's forward gave the trained policy on the device equal
    an fp32 CPU forward of the saved (merged) weights: the step after a real update, which a forward that
    drops the adapter, cuts or labels the tokens differently, or computes garbage would miss."""
    import torch

    from ar2dlm.core.models import load_conventions, load_model

    load_model(out, device="cpu")  # recorded sha256 and finite weights
    info = load_conventions(out)
    losses = [r[k] for r in info["log"] for k in ("loss", "train_loss") if k in r]
    after, before = weights(out), weights(base)
    bases = [before, {k: v.to(torch.bfloat16).float() for k, v in before.items()}]
    embed = "model.embed_tokens.weight"
    kept = [b for b in bases if torch.equal(after[embed], b[embed])]
    linear = [k for k in before if k.endswith("proj.weight")]
    moved = max(float((after[k] - kept[0][k]).abs().max()) for k in linear) if kept else 0.0
    finite = all(math.isfinite(x) for x in losses) and bool(losses)
    accuracy = info["reward_accuracy"]
    # before any update the policy is its reference (LoRA's B starts at 0), so every pair's margin is 0 and
    # DPO's loss is -log sigmoid(0) = log 2: a reference model, an ELBO's masks not shared by policy and
    # reference, or a wrong sign would show here
    sound = finite and moved > 0 and bool(kept) and info["dpo"]["lora"]
    held_out = info["evaluation"]  # TRL's; a DLM's held-out pairs are scored on ELBO masks the device draws
    device = [held_out[f"eval_logps/{k}"] for k in ("chosen", "rejected")] if held_out else []
    reference = held_out_logps(ctx, out, info["dpo"]) if held_out else []

    def compare(value):
        first, logps = value[0], value[1:]
        rel = max_rel(logps, reference)
        ok = sound and abs(first - math.log(2)) <= DPO_FIRST_LOSS_TOL and rel <= DPO_LOGPS_TOL
        held = f", held-out log-probabilities {logps} vs fp32 CPU {reference} ({rel:.1e})" if held_out else ""
        return ok, (
            f"first loss {first:.6f}, losses {losses}, max |dW| of {len(linear)} projections {moved:.2e}, "
            f"embeddings kept: {bool(kept)}, reward accuracy {accuracy:.2f}{held}"
        )

    ctx.judge(
        check,
        [losses[0] if losses else math.nan, *device],
        compare,
        f"two TRL steps (the first at learning rate 0): the first loss log 2 within {DPO_FIRST_LOSS_TOL:g} "
        "(policy = reference); the merged LoRA delta moves the projections and leaves the embeddings as loaded"
        + (
            f"; the trained policy's held-out log-probabilities within {DPO_LOGPS_TOL:g} relative of fp32 on the CPU"
            if held_out
            else ""
        ),
    )


def held_out_logps(ctx: Context, out: Path, cfg: dict) -> list[float]:
    """Mean log-probabilities of the chosen and the rejected held-out responses under the saved model,
    fp32 on the CPU, cut as TRL cuts them (TRL's ``eval_logps/*`` on the same rows, to 1e-6 on a CPU)."""
    import torch

    from ar2dlm.armap.dpo import encode_pairs
    from ar2dlm.core.likelihood import ar_loglikelihood
    from ar2dlm.core.models import load_model
    from ar2dlm.provenance import read_jsonl

    model, tok, _, _ = load_model(out, device="cpu", dtype=torch.float32)
    pairs = encode_pairs(tok, read_jsonl(ctx.work / "prefs_eval.jsonl"), cfg["max_length"])
    return [float(torch.tensor(ar_loglikelihood(model, p, tok.pad_token_id)).mean()) for p in pairs]


def gamma_stage(ctx: Context) -> None:
    """One gamma of AR-MAP's search: the DPO'd teacher's vector merged into the mdlm DLM."""
    from ar2dlm.armap.gamma import GammaSearch
    from ar2dlm.armap.pipeline import ArmapFolders, search
    from ar2dlm.core.models import final_checkpoint
    from ar2dlm.provenance import read_jsonl

    _, mdlm = ctx.need("run:mdlm")
    dlm, dpo, teacher = final_checkpoint(mdlm / "train.json"), ctx.need("dpo_lora_teacher"), ctx.need("teacher")
    cfg = {
        "grid": [1.0],
        "beta": 0.1,
        "eval_pairs": 4,
        "elbo_samples": 2,
        "batch_size": 8,
        "merges": {"task_arithmetic": {}},
    }
    out = ctx.work / "gamma"
    result = search(
        ArmapFolders(teacher, dpo, dlm),
        read_jsonl(ctx.work / "prefs_eval.jsonl"),
        GammaSearch.from_config(cfg, "task_arithmetic", 0),
        out / "curve.json",
        out / "model",
    )
    base, tuned, pre = weights(dlm), weights(dpo), weights(teacher)
    gamma, curve = result["gamma_hat"], result["curve"]

    def compare(merged):
        err = max(float((merged[k] - (base[k] + gamma * (tuned[k] - pre[k]))).abs().max()) for k in base)
        return len(curve) == 1 and gamma == 1.0 and err <= MERGE_TOL, (
            f"gamma {gamma}: reward accuracy {curve[0]['reward_accuracy']:.2f}, merge error {err:.1e}"
        )

    ctx.judge(
        "gamma_point",
        weights(out / "model"),
        compare,
        f"one scored point; the saved model is dlm + gamma * (dpo - teacher) within {MERGE_TOL:g}",
    )


def flex_stage(ctx: Context) -> None:
    """The mdlm and efficient_dlm losses and gradients, flex attention against dense masks (fp32)."""
    for family in FLEX_FAMILIES:
        ctx.guarded((f"flex_vs_dense_{family}",), check_flex, ctx, family)


def check_flex(ctx: Context, family: str) -> None:
    dense, flex, grad_diff = flex_against_dense(ctx, family)

    def compare(flex_loss):
        loss_diff = abs(flex_loss - dense) / abs(dense)
        return loss_diff <= FLEX_TOL[0] and grad_diff <= FLEX_TOL[1], (
            f"loss {dense:.4f}: relative difference {loss_diff:.1e}, gradients {grad_diff:.1e}"
        )

    ctx.judge(
        f"flex_vs_dense_{family}",
        flex,
        compare,
        f"fp32: loss within {FLEX_TOL[0]:g} relative, gradients within {FLEX_TOL[1]:g} relative L2",
    )


def flex_against_dense(ctx: Context, family: str) -> tuple[float, float, float]:
    """The loss through dense masks (sdpa) and through flex attention, and their gradients' relative L2
    difference."""
    import torch
    from transformers import AutoModelForCausalLM

    from ar2dlm.methods.registry import objective_for
    from ar2dlm.training.data import MicroBatch
    from ar2dlm.training.trainer import run_conventions

    run, tok = run_settings(ctx, family, "fp32"), ctx.need("tokenizer")
    conv = run_conventions(run, tok)
    rows, seq = ctx.sizes["batch_size"], ctx.sizes["seq_len"]
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, len(tok), (rows, seq), generator=gen)
    valid = torch.ones_like(ids)
    valid[1, seq // 2 + 3 :] = 0  # a right-padded row, its padding across a flex block boundary
    ids[1, seq // 2 + 3 :] = tok.pad_token_id
    plens = torch.randint(0, seq // 4, (rows,), generator=gen)
    mb = MicroBatch(ids, valid, plens, torch.arange(rows), 1, 0).to(ctx.device)
    out = {}
    for impl in ("sdpa", "flex_attention"):
        model = AutoModelForCausalLM.from_pretrained(str(ctx.need("teacher")), dtype=torch.float32).to(ctx.device)
        model.set_attn_implementation(impl)
        terms = objective_for(run, conv, 0).terms(model, None, mb, 0, torch.Generator().manual_seed(7))
        loss = sum(terms.values())
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        out[impl] = (float(loss.detach()), grads)
        del model
    (dense, g0), (flex, g1) = out["sdpa"], out["flex_attention"]
    return dense, flex, float((g1 - g0).norm() / g0.norm())


def memory_stage(ctx: Context) -> None:
    """Measured peak of a training step against the planner's estimate, per case."""
    for case in MEMORY_CASES[(ctx.device, ctx.quick)]:
        ctx.guarded((f"memory_{case[0]}",), check_memory, ctx, *case)


def check_memory(ctx: Context, family: str, shape, rows: int, seq: int) -> None:
    measured, estimated, note = (memory_cuda if ctx.device == "cuda" else memory_cpu)(family, shape, rows, seq)
    name = shape if isinstance(shape, str) else f"{shape['hidden']}-wide, {shape['layers']} layers"

    def compare(peak):
        error = estimated / peak - 1
        return abs(error) <= MEMORY_TOL, (
            f"{name}, {rows} x {seq}: measured {peak:.2f} GB, planner {estimated:.2f} GB ({error:+.0%})" + note
        )

    ctx.judge(
        f"memory_{family}",
        measured,
        compare,
        f"ar2dlm.plan.memory's estimate within {MEMORY_TOL:.0%} of the measured peak",
    )


def memory_cpu(family: str, shape: dict, rows: int, seq: int) -> tuple[float, float, str]:
    """The peak resident size of three fp32 steps in a fresh process, and the planner's CPU estimate
    (``benchmarks/train_memory.py``)."""
    from train_memory import estimated

    case = {"name": family, "shape": shape, "run": FAMILIES[family], "rows": rows, "seq": seq, "checkpointing": False}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "train_memory.py"), "--case", json.dumps(case)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    if proc.returncode:
        raise RuntimeError(f"train_memory.py failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_gb"], estimated(case)["estimate_gb"], ""


def memory_cuda(family: str, shape: str, rows: int, seq: int) -> tuple[float, float, str]:
    """``torch.cuda.max_memory_allocated`` over four steps as the trainer takes them (fp32 weights and
    AdamW, bf16 autocast, flex attention, activation checkpointing, a bf16 teacher), and the planner's
    estimate for one GPU (``benchmarks/gpu_step.py``)."""
    import torch
    from gpu_step import step_case
    from train_memory import case_run

    from ar2dlm.plan.memory import QWEN3_SHAPES

    gc.collect()
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated() / 1e9  # what this process still holds from earlier stages
    r = step_case(QWEN3_SHAPES[shape], case_run(FAMILIES[family], rows, seq, True), rows, seq, "flex_attention")
    return r["peak_gb"] - held, r["planner_gb"], f", {r['tokens_per_s']:.0f} tokens/s ({held:.2f} GB held before)"


def memory_checks(device: str, quick: bool) -> tuple[str, ...]:
    return tuple(f"memory_{family}" for family, *_ in MEMORY_CASES[(device, quick)])


def stages(device: str, quick: bool) -> list[Stage]:
    return [
        Stage("train", (*(f"train_{f}" for f in FAMILIES), "on_policy_rollouts"), train_stage),
        Stage("resume", ("resume_losses", "resume_weights"), resume_stage, ("train",)),
        Stage("two_process", ("two_process_equals_one", "two_process_resumes_on_one"), two_process_stage),
        Stage("decode", ("decode_block_cache", "decode_engine"), decode_stage, ("train",)),
        Stage("dpo", ("dpo_lora_teacher", "dpo_lora_dlm"), dpo_stage, ("train",)),
        Stage("gamma", ("gamma_point",), gamma_stage, ("train", "dpo")),
        Stage(
            "flex",
            tuple(f"flex_vs_dense_{f}" for f in FLEX_FAMILIES),
            flex_stage,
            cpu_skip="flex attention has no CPU backward in torch (NotImplementedError); its CPU forward "
            "is compared with dense masks in tests/test_selected_logits.py",
        ),
        Stage("memory", memory_checks(device, quick), memory_stage, inputs=False),
        Stage("decode_graphs", ("decode_graphed",), decode_graphs_stage, inputs=False),
        Stage("decode_speed", ("decode_speed",), decode_speed_stage, inputs=False),
    ]


# Checks whose pass compares no value that can be altered (``Context.judge``): finiteness and movement only (an
# on-policy run's losses: its rollouts sample in bf16 on the GPU, so no fp32 CPU run draws the same
# tokens to give a first loss to compare; the whole check's time)
COMPARES_NO_VALUE = ("wall_time",)
DPO_FIRST_LOSS_TOL = 1e-3  # |first DPO loss - log 2|: bf16 scores of two identical models agree exactly
# the trained policy's held-out mean log-probabilities, bf16 on the device against fp32 on the CPU, relative:
# at the check's CUDA size bf16 autocast on a CPU moved them by 1.2e-3; the adapter left out moves them by
# 1.0e-2 and 1.9e-2 (chosen, rejected), one token's log-probability by about 3e-2. A causal mask left out
# moves them by 2e-4 only (this briefly trained teacher predicts mostly from the current token): the
# training and decoding checks, which compare this project's own forwards, are the ones to catch a mask
DPO_LOGPS_TOL = 5e-3


def check_names(device: str, quick: bool) -> list[str]:
    """Every check the script reports for a device and size, in order."""
    return [c for s in stages(device, quick) for c in s.checks] + ["wall_time"]


# ---------------------------------------------------------------------------------------------- driver


def missing_packages() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def run_stage(ctx: Context, stage: Stage) -> None:
    ctx.stage, ctx.stage_start = stage.name, time.time()
    print(f"\n== {stage.name} ({time.time() - ctx.start:.0f} s in)", flush=True)
    if ctx.device == "cpu" and stage.cpu_skip:
        for check in stage.checks:
            ctx.results[check] = Result(check, stage.name, "SKIP", "", f"not on a CPU: {stage.cpu_skip}", 0.0)
        return
    if ctx.remaining() <= 0:
        ctx.fail_unreported(stage.checks, TIMED_OUT.format(ctx.budget_s))
        return
    try:
        ctx.guarded(stage.checks, stage.run, ctx)
    finally:
        release_memory(ctx)
    ctx.fail_unreported(stage.checks, "the stage did not report it")


def prepare_inputs(ctx: Context) -> None:
    """``prepare``, its failure recorded for the stages that read its outputs (they fail naming it)."""
    try:
        prepare(ctx)
    except Exception as exc:
        traceback.print_exc()
        ctx.artifacts["prepare_error"] = f"preparing the inputs failed ({type(exc).__name__}: {exc})"[:300]


def release_memory(ctx: Context) -> None:
    gc.collect()
    if ctx.device == "cuda":
        import torch

        torch.cuda.empty_cache()


def selected(all_stages: list[Stage], only: list[str] | None) -> list[Stage]:
    """The stages asked for and those they read from, in the script's order."""
    if not only:
        return all_stages
    by_name = {s.name: s for s in all_stages}
    wanted, todo = set(), list(only)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(by_name[name].needs)
    return [s for s in all_stages if s.name in wanted]


def summary(ctx: Context, results: list[Result]) -> str:
    lines = ["| check | status | measured | criterion | altered | s |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r.check} | {r.status} | {r.measured} | {r.criterion} | {r.altered or '-'} | {r.seconds} |" for r in results
    ]
    failed = [r.check for r in results if r.status == "FAIL"]
    lines.append(
        f"\n{len(results) - len(failed)} of {len(results)} checks passed or skipped on {ctx.device}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="smaller models and fewer steps (SIZES['quick'])")
    ap.add_argument("--out", help="write the checks as JSON here")
    ap.add_argument("--workdir", help="keep the models and runs here (default: a temporary folder, removed)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="time for the whole check (default %(default)s)")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=[s.name for s in stages("cuda", False)],
        metavar="STAGE",
        help="these stages (and the stages they read from): %(choices)s",
    )
    ap.add_argument(
        "--inject-failure",
        metavar="CHECK",
        help="report CHECK's verdict on its altered value (every run judges both, column `altered`), to see it "
        "fail end to end: a check that compares values (train_*, on_policy_rollouts, resume_*, two_process_*, "
        "decode_*, dpo_lora_*, gamma_point, flex_vs_dense_*, memory_*, decode_speed), or `all`: every one of "
        "them at once (the JSON lists those altered)",
    )
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":  # before torch is imported: every library and subprocess sees no GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    missing = missing_packages()
    if missing:
        print(
            f"gpu_check: the environment lacks {', '.join(missing)}; this check installs nothing (it runs offline "
            "in the environment it is given): install the project's environment first",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(REPO))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver), or run with "
            "--device cpu for the CPU part",
            file=sys.stderr,
        )
        return 2
    names = check_names(args.device, args.quick)
    if args.inject_failure and args.inject_failure not in (*names, "all"):
        print(
            f"gpu_check: --inject-failure {args.inject_failure}: no such check (known: {', '.join(names)})",
            file=sys.stderr,
        )
        return 2
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(args.device, args.quick, work, args.budget_s, args.inject_failure)
    try:
        todo = selected(stages(args.device, args.quick), args.only)
        if any(s.inputs for s in todo):
            prepare_inputs(ctx)
        for stage in todo:
            run_stage(ctx, stage)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.time() - ctx.start
    ctx.stage, ctx.stage_start = "all", ctx.start
    ctx.expect("wall_time", wall <= args.budget_s, f"{wall:.0f} s", f"the whole check within {args.budget_s:.0f} s")
    results = [ctx.results[n] for n in names if n in ctx.results]
    print("\n" + summary(ctx, results), flush=True)
    failed = any(r.status == "FAIL" for r in results)
    if args.out:
        from ar2dlm.provenance import library_versions

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
        Path(args.out).write_text(
            json.dumps(
                {
                    "device": args.device,
                    "gpu": gpu,
                    "quick": args.quick,
                    "sizes": ctx.sizes,
                    "memory_cases": MEMORY_CASES[(args.device, args.quick)],
                    "passed": not failed,
                    "wall_seconds": round(wall, 1),
                    "budget_seconds": args.budget_s,
                    "versions": library_versions(),
                    "checks": [vars(r) for r in results],
                    "perturbed": sorted(ctx.perturbed),
                },
                indent=1,
            )
        )
    if args.inject_failure and args.inject_failure not in (*ctx.perturbed, "all"):
        print(
            f"gpu_check: --inject-failure {args.inject_failure}: the check was not reached, or compares nothing the "
            "flag can alter",
            file=sys.stderr,
        )
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
