"""Decoding throughput benchmark: DLM block decoding (cached, uncached) vs AR with KV cache.

    python benchmarks/decode.py --model results/models/tiny/teacher --prompts results/data/code/eval.jsonl \
        --out results/bench/decode.json

A checkpoint whose conventions are causal (an AR teacher) is decoded as an unconverted
block-attention DLM (``--as-block-dlm``): the timing mechanics are the same, tokens per step are
only meaningful for a converted model.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.models import load_model
from ar2dlm.data.tokenization import encode_pair
from ar2dlm.evaluation.decode_speed import decode_benchmark, format_report, task_benchmark
from ar2dlm.pipeline.layout import final_checkpoint
from ar2dlm.provenance import library_versions, read_jsonl, write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        required=True,
        help="a checkpoint folder, or a conversion folder with train.json (its last checkpoint is used)",
    )
    ap.add_argument("--ar-model", default=None, help="the AR model timed as the baseline (default: --model)")
    ap.add_argument("--prompts", required=True, help="JSONL with a 'prompt' field (the code suite)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--lengths", default="64,128,256,512,1024")
    ap.add_argument("--cache-lengths", default="256,1024")
    ap.add_argument("--thresholds", default="0.5,0.6,0.7,0.8,0.9,1.0")
    ap.add_argument("--ratio-length", type=int, default=256)
    ap.add_argument("--reference-threshold", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--task-prompts", type=int, default=0, help="also decode this many prompts to end-of-text")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--as-block-dlm", action="store_true", help="decode a causal checkpoint with block attention")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    model_dir = Path(a.model)
    if (model_dir / "train.json").is_file():
        model_dir = final_checkpoint(model_dir / "train.json")
    model, tok, conv, _ = load_model(model_dir)
    ar_model = load_model(a.ar_model).model if a.ar_model else model
    converted = conv.is_diffusion
    if not converted:
        if not a.as_block_dlm:
            sys.exit(f"{a.model} is a causal checkpoint; pass --as-block-dlm to time it as an unconverted DLM")
        conv = Conventions(
            attention="block",
            shift=True,
            mask_token_id=conv.mask_token_id,
            eos_token_id=conv.eos_token_id,
            pad_token_id=conv.pad_token_id,
            block_size=a.block_size,
        )
    prompts = [encode_pair(tok, r["prompt"], "", eos=False)[0] for r in read_jsonl(a.prompts)[: a.batch_size]]
    result = decode_benchmark(
        model,
        ar_model,
        tok,
        conv,
        prompts,
        block_size=a.block_size,
        lengths=ints(a.lengths),
        thresholds=[float(x) for x in a.thresholds.split(",")],
        ratio_length=a.ratio_length,
        cache_lengths=ints(a.cache_lengths),
        reference_threshold=a.reference_threshold,
    )
    if a.task_prompts:
        tasks = [encode_pair(tok, r["prompt"], "", eos=False)[0] for r in read_jsonl(a.prompts)[: a.task_prompts]]
        result["tasks"] = task_benchmark(
            model,
            ar_model,
            tok,
            conv,
            tasks,
            block_size=a.block_size,
            max_new_tokens=a.max_new_tokens,
            thresholds=[float(x) for x in a.thresholds.split(",")],
            batch_size=a.batch_size,
        )
    result.update(
        {
            "model": str(model_dir),
            "ar_model": a.ar_model or str(model_dir),
            "converted_dlm": converted,
            "conventions": conv.to_dict(),
            "versions": library_versions(),
        }
    )
    write_json(a.out, result)
    print(format_report(result))
    print(json.dumps(result["ratios"]))


if __name__ == "__main__":
    main()
