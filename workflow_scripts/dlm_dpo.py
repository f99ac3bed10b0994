from ar2dlm.armap.dpo import train_dpo
from ar2dlm.armap.pipeline import preference_rows
from ar2dlm.provenance import log_to
from ar2dlm.pipeline.layout import final_checkpoint, preference_domain

log_to(snakemake.log[0], snakemake.threads)
cfg, inp, wc = snakemake.params.cfg, snakemake.input, snakemake.wildcards
dlm = final_checkpoint(inp.manifest)
domains = [preference_domain(p) for p in inp.train]
train_dpo(dlm, preference_rows(inp.train, cfg["train_pairs"]), preference_rows(inp.eval, cfg["eval_pairs"]),
          snakemake.output[0], cfg, int(wc.seed), domains)
