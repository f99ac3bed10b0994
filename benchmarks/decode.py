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

import torch

from ar2dlm.benchmark import decode_benchmark, format_report
from ar2dlm.conventions import Conventions
from ar2dlm.models import load_model
from ar2dlm.provenance import library_versions, read_jsonl, write_json
from ar2dlm.tokenization import encode_pair


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
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
    ap.add_argument("--as-block-dlm", action="store_true", help="decode a causal checkpoint with block attention")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    model, tok, info = load_model(a.model)
    conv = Conventions.from_dict(info)
    converted = conv.is_diffusion
    if not converted:
        if not a.as_block_dlm:
            sys.exit(f"{a.model} is a causal checkpoint; pass --as-block-dlm to time it as an unconverted DLM")
        conv = Conventions(attention="block", shift=True, mask_token_id=conv.mask_token_id, eos_token_id=conv.eos_token_id,
                           pad_token_id=conv.pad_token_id, block_size=a.block_size)
    prompts = [encode_pair(tok, r["prompt"], "", eos=False)[0] for r in read_jsonl(a.prompts)[: a.batch_size]]
    result = decode_benchmark(model, tok, conv, prompts, block_size=a.block_size, lengths=ints(a.lengths),
                              thresholds=[float(x) for x in a.thresholds.split(",")], ratio_length=a.ratio_length,
                              cache_lengths=ints(a.cache_lengths), reference_threshold=a.reference_threshold)
    result.update({"model": a.model, "converted_dlm": converted, "conventions": conv.to_dict(),
                   "versions": library_versions()})
    write_json(a.out, result)
    print(format_report(result))
    print(json.dumps(result["ratios"]))


if __name__ == "__main__":
    main()
