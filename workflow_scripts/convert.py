from pathlib import Path

from ar2dlm.provenance import log_to, write_json
from ar2dlm.training.trainer import train_run

log_to(snakemake.log[0], snakemake.threads)
wc, out = snakemake.wildcards, Path(snakemake.output[0])
info = train_run(snakemake.params.run, snakemake.input.teacher, snakemake.input.corpus, out.parent,
                 seed=int(wc.seed), preset=snakemake.params.preset, model_name=wc.model)
write_json(out, info)
