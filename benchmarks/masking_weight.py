"""How much the 1/p weight of position-dependent masking shakes the gradient, and what a bound costs.

    python benchmarks/masking_weight.py [--draws 200] [--block-size 8 32] [--beta 2.0] [--out FILE.json]

Efficient-DLM's position-dependent masking gives the token at offset j of a block the masking
probability p = t ** exp(-beta (u - 1/2)), u = (j + 1/2) / B, with t ~ U(eps, 1). Near t = eps the
first offsets get p far below eps (beta 2, B 32: p = 1.3e-8 at offset 0), so a token masked there
carries the weight 1/p ~ 1e8: rare, unbiased, and when it happens it is the whole gradient. Three
weightings are compared on one fixed batch, each over ``--draws`` noise draws (the same uniforms
for all three):

- ``1/p``: as the schedule says (unbiased for the schedule);
- ``p floored at eps``: p' = max(p, eps) both for masking and for the weight, so the loss is still
  unbiased for the schedule it trains on, and no weight exceeds 1/eps (what uniform masking has): the
  pipeline's rule (``core.diffusion.masking_probs``; the script checks it draws the same p');
- ``weight clamped at 1/eps``: the masks as drawn, the weight capped (biased: rare masks count less).

For each: the largest weight drawn, the mean and the standard deviation of the gradient norm, its
largest value over the median, and the cosine of the mean gradient with the ``1/p`` mean gradient
(how far a bound moves the expected update). A randomly initialised model of the tiny preset's
width on a fixed batch of random tokens; block attention with clean context (the 2L layout), no
shift, as Efficient-DLM trains.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.diffusion import NoisedBatch, eligible_tokens, forward_aligned, masking_probs, selected_nll

V, MASK, EOS, PAD = 1024, 1, 2, 3


def model_and_batch(block_size: int, rows: int, length: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=192,
        intermediate_size=576,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=48,
        max_position_embeddings=2 * length,
    )
    model = Qwen3ForCausalLM(cfg)
    clean = torch.randint(4, V, (rows, length))
    valid = torch.ones_like(clean)
    prompt_lens = torch.zeros(rows, dtype=torch.long)
    conv = Conventions("block", False, MASK, EOS, PAD, block_size)
    return model, conv, clean, valid, prompt_lens


def gradient_norm(model, conv, clean, valid, prompt_lens, masked, weight, prob) -> tuple[float, torch.Tensor]:
    elig = eligible_tokens(valid, prompt_lens, conv.shift)
    noisy = torch.where(masked, torch.full_like(clean, MASK), clean)
    batch = NoisedBatch(clean, noisy, masked, weight, elig, valid, prompt_lens, prob)
    model.zero_grad()
    if masked.any():
        logits, _ = forward_aligned(model, batch, conv, where=masked)
        loss = (selected_nll(logits, clean[masked]) * weight[masked]).sum() / elig.sum()
        loss.backward()
    grad = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in model.parameters()])
    return float(grad.norm()), grad


def measure(block_size: int, beta: float, draws: int, eps: float, rows: int, length: int, seed: int) -> dict:
    model, conv, clean, valid, prompt_lens = model_and_batch(block_size, rows, length, seed)
    gen = torch.Generator().manual_seed(seed)
    variants = ("1/p", "p floored at eps", "weight clamped at 1/eps")
    norms = {v: [] for v in variants}
    sums = {v: None for v in variants}
    top = {v: 0.0 for v in variants}
    for _ in range(draws):
        state = gen.get_state()
        t = masking_probs(valid, prompt_lens, conv, 0.0, eps, gen)  # one t per block
        u = (torch.arange(length).remainder(block_size).float() + 0.5) / block_size
        p = t.pow(torch.exp(-beta * (u - 0.5)))  # the schedule unfloored
        gen.set_state(state)
        assert torch.equal(masking_probs(valid, prompt_lens, conv, beta, eps, gen), p.clamp(min=eps))  # the pipeline's
        r = torch.rand(clean.shape, generator=gen)
        elig = eligible_tokens(valid, prompt_lens, conv.shift)
        for v in variants:
            prob = p.clamp(min=eps) if v == "p floored at eps" else p
            masked = elig & (r < prob)
            weight = torch.where(masked, 1.0 / prob, torch.zeros_like(prob))
            if v == "weight clamped at 1/eps":
                weight = weight.clamp(max=1 / eps)
            top[v] = max(top[v], float(weight.max()))
            n, g = gradient_norm(model, conv, clean, valid, prompt_lens, masked, weight, prob)
            norms[v].append(n)
            sums[v] = g if sums[v] is None else sums[v] + g
    out = {}
    for v in variants:
        t = torch.tensor(norms[v])
        cos = torch.nn.functional.cosine_similarity(sums[v], sums["1/p"], dim=0)
        out[v] = {
            "largest weight": top[v],
            "grad norm mean": float(t.mean()),
            "grad norm sd": float(t.std()),
            "largest / median": float(t.max() / t.median()),
            "cosine of mean gradient with 1/p's": float(cos),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--block-size", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--beta", type=float, default=2.0)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = {}
    for b in args.block_size:
        first = (0.5 / b - 0.5) * -args.beta
        print(
            f"\nblock {b}, beta {args.beta}, eps {args.eps}: the first offset's p at t = eps is "
            f"{args.eps ** math.exp(first):.2e} (weight {args.eps ** -math.exp(first):.2e}); {args.draws} draws, "
            f"{args.rows} x {args.length} tokens\n"
        )
        res = measure(b, args.beta, args.draws, args.eps, args.rows, args.length, args.seed)
        results[f"block {b}"] = res
        cols = list(next(iter(res.values())))
        print("| weighting | " + " | ".join(cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for v, row in res.items():
            print(f"| {v} | " + " | ".join(f"{row[c]:.4g}" for c in cols) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
