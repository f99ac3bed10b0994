from ar2dlm.armap.pipeline import preference_rows, search
from ar2dlm.provenance import log_to, read_json

log_to(snakemake.log[0], snakemake.threads)
inp, out, wc, p = snakemake.input, snakemake.output, snakemake.wildcards, snakemake.params
dlm = f"{inp.manifest.rsplit('/', 1)[0]}/step_{read_json(inp.manifest)['steps']}"
cfg = {**p.cfg["gamma"], "merges": p.cfg["merges"]}
search(inp.teacher, inp.dpo, dlm, preference_rows(inp.eval, cfg["eval_pairs"]), cfg, wc.merge, out.curve, out.model,
       seed=int(wc.seed))
