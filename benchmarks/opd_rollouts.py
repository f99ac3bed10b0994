"""What OPDLM's on-policy states look like when its rollouts are greedy or sampled.

    python benchmarks/opd_rollouts.py --teacher results/models/tiny/teacher \
        --prompts results/data/code/eval.jsonl [--n 64] [--length 32] [--temperatures 0 1]

The student right after conversion (the teacher's weights under the run's conventions: block
attention, block 8, with the AR shift as the tiny OPD runs, or without it: ``--no-shift``) decodes
``--n`` prompts with OPDLM's sampler at each temperature (divelab/OPDLM samples at 1; greedy is
0). For each: the share of rollouts that are one token repeated, distinct tokens per rollout over
its length, the share that reach end-of-text, and the teacher's mean NLL per token of the rollouts
(how far the states the student trains on are from text the teacher would write).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.likelihood import loglikelihood
from ar2dlm.core.models import load_model
from ar2dlm.core.sampling import Decoding, generate_dlm
from ar2dlm.data.tokenization import encode_pair
from ar2dlm.provenance import read_jsonl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--prompts", required=True, help="a JSONL file of {prompt}")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--no-shift", action="store_true", help="OPDLM's own convention (the tiny runs keep the shift)")
    ap.add_argument("--out")
    args = ap.parse_args()
    teacher, tok, ar_conv, _ = load_model(args.teacher, dtype=torch.float32, device="cpu")
    student, _, _, _ = load_model(args.teacher, dtype=torch.float32, device="cpu")
    conv = Conventions(
        "block", not args.no_shift, tok.mask_token_id, ar_conv.eos_token_id, ar_conv.pad_token_id, args.block_size
    )
    prompts = [encode_pair(tok, it["prompt"], "", eos=False)[0] for it in read_jsonl(args.prompts)[: args.n]]
    results = {}
    print(
        f"{len(prompts)} prompts, {args.length} tokens, block {args.block_size}, threshold {args.threshold}, "
        f"shift {conv.shift}\n"
    )
    print("| temperature | one token repeated | distinct tokens / length | reach end-of-text | teacher NLL / token |")
    print("|---|---|---|---|---|")
    for t in args.temperatures:
        decoding = Decoding(args.length, args.block_size, threshold=args.threshold, temperature=t, stop_at_eos=False)
        outs, _ = generate_dlm(student, conv, prompts, decoding, row_seeds=list(range(len(prompts))))
        eos = conv.eos_token_id
        cut = [o[: o.index(eos)] if eos in o else o for o in outs]
        repeated = sum(1 for o in outs if len(set(o)) == 1) / len(outs)
        distinct = sum(len(set(o)) / len(o) for o in outs) / len(outs)
        ended = sum(1 for o in outs if eos in o) / len(outs)
        pairs = [(p, c) for p, c in zip(prompts, cut) if c]
        lls = loglikelihood(teacher, ar_conv, pairs)
        nll = -sum(lls) / sum(len(c) for _, c in pairs)
        results[t] = {"repeated": repeated, "distinct": distinct, "ended": ended, "teacher_nll": nll}
        print(f"| {t:g} | {repeated:.3f} | {distinct:.3f} | {ended:.3f} | {nll:.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
