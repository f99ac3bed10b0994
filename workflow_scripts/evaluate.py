from pathlib import Path

from ar2dlm.core.models import checkpoint_dir
from ar2dlm.evaluation.suite import run_benchmark
from ar2dlm.provenance import log_to, write_json, write_jsonl

log_to(snakemake.log[0], snakemake.threads)
wc, inp, out = snakemake.wildcards, snakemake.input, Path(snakemake.output[0])
if "manifest" in inp.keys():
    model_dir, seed = checkpoint_dir(Path(inp.manifest).parent, wc.step), int(wc.seed)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"no checkpoint {model_dir} (the run writes every training.checkpoint_every steps)")
else:  # a teacher, DPO'd or merged model folder
    model_dir = Path(inp.model)
    seed = int(wc.seed) if "seed" in wc.keys() else snakemake.params.seed
data = {k: v for k, v in inp.items() if k not in ("manifest", "model")}
result = run_benchmark(wc.benchmark, snakemake.params.spec, model_dir, data, seed=seed)
samples = result.pop("samples", None)
if samples is not None:  # kept beside the result; the result JSON is written last
    write_jsonl(out.with_suffix(".samples.jsonl"), samples)
write_json(out, result)
