from ar2dlm.armap.dpo import train_dpo
from ar2dlm.armap.pipeline import preference_rows
from ar2dlm.pipeline.layout import preference_domain
from ar2dlm.provenance import log_to

log_to(snakemake.log[0], snakemake.threads)
cfg, inp = snakemake.params.cfg, snakemake.input
domains = [preference_domain(p) for p in inp.train]
train_dpo(inp.model, preference_rows(inp.train, cfg["train_pairs"]), preference_rows(inp.eval, cfg["eval_pairs"]),
          snakemake.output[0], cfg, snakemake.params.seed, domains)
