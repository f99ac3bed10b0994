"""Decode benchmark: the DLM against its AR teacher on real responses, through the decode engine
and through the paths it replaced (transformers' ``generate``; the DLM over a ``DynamicCache``).

    python benchmarks/decode.py --model results/models/tiny/ed/seed0 --ar-model results/models/tiny/teacher \
        --problems results/data/benchmarks/synthetic_code.jsonl --out results/bench/decode.json [--compile]

Prints, as Markdown, one row per decoder (tokens/s, response tokens per forward, pass@1, the ratio
to the engine's AR and to ``generate``), milliseconds per forward by step kind, the warm-up
(compile) seconds, the DLM's speed-up at equal accuracy, and the cost of one forward against the
positions it computes (1 to 32) on the model and, with ``--cost-qwen3-0.6b``, on a random-weight
Qwen3-0.6B-shape model, where weights no longer fit in a CPU's cache. Writes the same as JSON,
and the table as Markdown beside it (``.md``).

A checkpoint whose conventions are causal (an AR teacher) is decoded as an unconverted
block-attention DLM with ``--as-block-dlm``: the timing mechanics are the same, tokens per forward
are only meaningful for a converted model.
"""

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.engine import compile_available
from ar2dlm.core.models import final_checkpoint, load_model, resolve_device
from ar2dlm.core.precision import cpu_native_bf16, resolve_dtype, torch_dtype
from ar2dlm.evaluation import decode_speed as ds
from ar2dlm.evaluation.code import code_prompts, score_responses
from ar2dlm.plan.memory import QWEN3_SHAPES
from ar2dlm.provenance import library_versions, read_jsonl, write_json


# Qwen3-0.6B's config.json: the widths whose weights (0.6B parameters) outgrow a CPU's caches
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a checkpoint folder, or a conversion folder with train.json")
    ap.add_argument("--ar-model", default=None, help="the AR model timed as the baseline (default: --model)")
    ap.add_argument("--problems", required=True, help="a code benchmark's problems (JSONL with prompts and tests)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--task-prompts", type=int, default=48, help="how many of the problems are decoded")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--thresholds", default="0.5,0.6,0.7,0.8,0.9,1.0")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="compile the engine's steps (torch.compile)")
    ap.add_argument("--style", default="body", help="how responses are read (the benchmark's style)")
    ap.add_argument("--format", default="evalplus", help="how they are scored (the benchmark's format)")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--parallel", type=int, default=2, help="test processes while scoring")
    ap.add_argument("--cost-tokens", default="1,2,4,8,16,32")
    ap.add_argument("--cost-context", type=int, default=256)
    ap.add_argument(
        "--cost-qwen3-0.6b", dest="cost_qwen3", action="store_true", help="also a random Qwen3-0.6B-shape model"
    )
    ap.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto", help="as the evaluation decodes")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--as-block-dlm", type=int, default=None, metavar="BLOCK", help="decode a causal checkpoint")
    return ap.parse_args(argv)


def load(a):
    model_dir = Path(a.model)
    if (model_dir / "train.json").is_file():
        model_dir = final_checkpoint(model_dir / "train.json")
    dtype = torch_dtype(resolve_dtype(a.dtype, resolve_device("auto")))
    model, tok, conv, _ = load_model(model_dir, dtype=dtype)
    ar_model = load_model(a.ar_model, dtype=dtype).model if a.ar_model else model
    if not conv.is_diffusion:
        if not a.as_block_dlm:
            sys.exit(f"{a.model} is a causal checkpoint; pass --as-block-dlm BLOCK to time it as an unconverted DLM")
        conv = Conventions("block", True, conv.mask_token_id, conv.eos_token_id, conv.pad_token_id, a.as_block_dlm)
    elif conv.attention != "block":
        sys.exit(f"{a.model} decodes by recomputing its canvas ({conv.attention} attention): time a block model")
    return model_dir, ds.SpeedModels(model, ar_model, tok, conv)


def qwen3_shape_curve(a, tokens) -> dict:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"]
    model = Qwen3ForCausalLM(shape.qwen3_config(max_position_embeddings=40960)).eval()
    dtype = torch.bfloat16 if cpu_native_bf16() else torch.float32
    curve = ds.cost_curve(model.to(dtype), tokens, a.cost_context)
    return {**curve, "dtype": str(dtype), "parameters": sum(p.numel() for p in model.parameters())}


def main(argv=None):
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    thresholds = sorted(float(x) for x in a.thresholds.split(","))
    if a.compile and not compile_available():
        sys.exit("--compile: torch.compile needs a C++ compiler here (install g++), or leave --compile out")
    model_dir, models = load(a)
    model, tok = models.dlm, models.tokenizer
    tasks = read_jsonl(a.problems)[: a.task_prompts]
    prompts = code_prompts(tok, tasks)
    device = next(model.parameters()).device
    rows = ds.decoders(models, thresholds, a.max_new_tokens, batch_size=a.batch_size, compile=a.compile)
    warm = ds.warm_up(rows, prompts, device)
    ds.interleaved(rows, prompts, a.batch_size, a.repeats, device)
    kinds = ds.kind_times(rows, prompts, a.batch_size)
    scoring = {"style": a.style, "format": a.format, "dataset": a.dataset, "parallel": a.parallel}
    pass1 = {r.label: score_responses(tok, tasks, r.responses, scoring)["metrics"]["base_pass@1"] for r in rows}
    records = ds.summary(rows, pass1)
    tokens = [int(x) for x in a.cost_tokens.split(",")]
    cost = {"model": ds.cost_curve(model, tokens, a.cost_context, compile=a.compile)}
    if a.cost_qwen3:
        cost["qwen3_0.6b_shape"] = qwen3_shape_curve(a, tokens)
    result = {
        "model": str(model_dir),
        "ar_model": a.ar_model or str(model_dir),
        "conventions": models.conv.to_dict(),
        "prompts": len(prompts),
        "batch_size": a.batch_size,
        "max_new_tokens": a.max_new_tokens,
        "repeats": a.repeats,
        "compiled": a.compile,
        "device": str(device),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "dtype": str(next(model.parameters()).dtype),
        **warm,
        "rows": records,
        "ms_per_forward": kinds,
        "equal_accuracy": ds.equal_accuracy_speedup(records),
        "cost_curve": cost,
        "versions": library_versions(),
    }
    write_json(a.out, result)
    table = pd.DataFrame(records).to_markdown(index=False)
    Path(a.out).with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"ms per forward by step kind: {kinds}")
    print(f"warm-up (compile) seconds: {warm['warm_up_seconds']}")
    print(f"equal accuracy: {result['equal_accuracy']}")
    print(f"cost curve (ms per forward by positions): {cost}")


if __name__ == "__main__":
    main()
