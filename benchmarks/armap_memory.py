"""Host memory of AR-MAP's weight work at the real Qwen3-0.6B shape: spectra and the gamma search's
merge step streamed tensor by tensor from safetensors, against whole state dicts in memory.

    python benchmarks/armap_memory.py [--workdir /tmp/armap_memory] [--out results/bench/armap_memory.json]

Builds three random folders of the shape (a teacher, a 'DPO' teacher and a 'DLM', bf16 safetensors
as the trainer exports them; 1.2 GB each), then runs each case in a fresh process and measures its
peak resident set size (the high-water mark reset after the imports):

- ``spectra_streamed``: ``streamed_spectra`` (svdvals of every matrix of both task vectors);
- ``spectra_in_memory``: the three state dicts and both task vectors in fp32, as spectra were
  computed before streaming (loading only: the SVDs add one matrix's workspace to either);
- ``merge_streamed``: one gamma of the search, ``stream_merge`` at gamma 2 into the DLM loaded in
  fp32 (the peak counted above the loaded model, 2.4 GB);
- ``merge_in_memory``: the same from state dicts (base, task vector and merged copy in fp32), with
  the whole-state-dict merges the tests check ``stream_merge`` against (``tests/reference_armap.py``).

Prints a Markdown table; the streamed cases' bound is a few fp32 copies of the largest tensor (the
151936 x 1024 embedding, 0.62 GB).
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]  # train_memory, and tests/ for the in-memory references
from train_memory import QWEN3_06B, random_qwen3, reset_peak_rss, status_bytes  # noqa: E402

CASES = ("spectra_streamed", "spectra_in_memory", "merge_streamed", "merge_in_memory")


def build_folders(work: Path) -> None:
    """teacher, dpo (teacher + 1e-3 noise) and dlm (teacher + 1e-2 noise), bf16 safetensors."""
    import torch

    if all((work / k / "model.safetensors").is_file() for k in ("teacher", "dpo", "dlm")):
        return
    torch.manual_seed(0)
    model = random_qwen3(QWEN3_06B).to(torch.bfloat16)
    model.save_pretrained(work / "teacher")
    base = {k: v.clone() for k, v in model.state_dict().items()}
    for name, scale in (("dpo", 1e-3), ("dlm", 1e-2)):
        with torch.no_grad():
            for k, p in model.state_dict().items():
                p.copy_(base[k] + scale * torch.randn_like(p))
        model.save_pretrained(work / name)


def run_case(case: str, work: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from ar2dlm.armap.merge import MergeSettings, stream_merge
    from ar2dlm.armap.spectra import streamed_spectra
    from ar2dlm.core.models import FolderWeights
    from tests.reference_armap import add_scaled, task_vector

    ar, dpo, dlm = (FolderWeights(work / k) for k in ("teacher", "dpo", "dlm"))
    largest = max(ar.shapes.values(), key=lambda s: s[0] * (s[1] if len(s) > 1 else 1))
    model = (
        AutoModelForCausalLM.from_pretrained(work / "dlm", dtype=torch.float32) if case.startswith("merge") else None
    )
    before = reset_peak_rss()  # a merge's peak is counted above the loaded fp32 model
    t0 = time.time()

    def full(w):
        return {n: w[n].float() for n in w.names()}

    if case == "spectra_streamed":
        rows = len(streamed_spectra(ar, dpo, dlm))
    elif case == "spectra_in_memory":
        a = full(ar)
        taus = task_vector(full(dpo), a), task_vector(a, full(dlm))
        rows = sum(t.dim() == 2 for t in taus[0].values())
    else:
        if case == "merge_streamed":
            stream_merge(model, (dlm, dpo, ar), 2.0, MergeSettings("task_arithmetic"))
        else:
            model.load_state_dict(add_scaled(full(dlm), task_vector(full(dpo), full(ar)), 2.0), strict=False)
        rows = len(dlm.names())
    return {
        "case": case,
        "peak_gb": round((status_bytes("VmHWM") - before) / 1e9, 2),
        "seconds": round(time.time() - t0, 1),
        "tensors": rows,
        "largest_tensor_fp32_gb": round(largest[0] * largest[1] * 4 / 1e9, 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/armap_memory")
    ap.add_argument("--out", default=None)
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process
    args = ap.parse_args()
    work = Path(args.workdir)
    if args.case:
        print(json.dumps(run_case(args.case, work)))
        return
    work.mkdir(parents=True, exist_ok=True)
    build_folders(work)
    results = []
    for case in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "--workdir", str(work), "--case", case],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
        print(results[-1], flush=True)
    print("\n| case | peak RSS growth (GB) | seconds |\n|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['peak_gb']} | {r['seconds']} |")
    print(f"\nlargest tensor in fp32: {results[0]['largest_tensor_fp32_gb']} GB")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
