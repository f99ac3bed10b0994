"""The fixed cost of one decoding forward of a Hugging Face Qwen3: what the planner adds per
rollout forward beside the bandwidth-bound weight and KV-cache reads.

    python benchmarks/forward_overhead.py [--layers 4 8 16] [--repeats 200]

Times single-token forwards with a KV cache at a width so small (64) that the arithmetic is
negligible, so what is left is the per-forward work that does not shrink with the width: Python
module calls, dispatch and kernel launches, which grow with the number of decoder layers. Fits
seconds = a + b x layers by least squares and prints a, b and the fitted cost of a 36-layer (8B)
forward. On CPU this measures the dispatch cost itself; on a GPU, run under CUDA, the same fit
gives the launch-bound overhead the planner's ``cluster.forward_overhead_ms_per_layer`` states.
Reports process CPU time as well as wall time: on a loaded machine the CPU time is the steadier.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def forward_seconds(layers: int, repeats: int, device: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one single-token forward with a KV cache, median of ``repeats``."""
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    )
    model = Qwen3ForCausalLM(cfg).to(device).eval()
    ids = torch.zeros(1, 32, dtype=torch.long, device=device)
    walls, cpus = [], []
    with torch.inference_mode():
        cache = DynamicCache(config=cfg)
        model(input_ids=ids, cache=cache, use_cache=True)
        step = ids[:, :1]
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            w, c = time.perf_counter(), time.process_time()
            model(input_ids=step, cache=cache, use_cache=True)
            if device == "cuda":
                torch.cuda.synchronize()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    return float(torch.tensor(walls).median()), float(torch.tensor(cpus).median())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON of the measurements and the fit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = {n: forward_seconds(n, args.repeats, args.device) for n in args.layers}
    x = torch.tensor([float(n) for n in rows], dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], dim=1)
    out = {"device": args.device, "threads": args.threads, "forwards": {}}
    for k, name in enumerate(("wall", "cpu")):
        y = torch.tensor([v[k] for v in rows.values()], dtype=torch.float64)
        a, b = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1).tolist()
        out["forwards"][name] = {
            "per_forward_ms": a * 1e3,
            "per_layer_ms": b * 1e3,
            "qwen3_8b_ms": (a + 36 * b) * 1e3,
            "measured_ms": {n: v[k] * 1e3 for n, v in rows.items()},
        }
        print(
            f"{name}: {a * 1e3:.2f} ms per forward + {b * 1e3:.3f} ms per layer -> {(a + 36 * b) * 1e3:.1f} ms "
            f"for a 36-layer forward ({args.device}, {args.threads} thread(s); measured: "
            + ", ".join(f"{n} layers {v[k] * 1e3:.2f} ms" for n, v in rows.items())
            + ")"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
