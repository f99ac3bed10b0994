from ar2dlm.data.build import build_preferences
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
inp, out = snakemake.input, snakemake.output
build_preferences(
    snakemake.params.data, snakemake.wildcards.domain, inp.get("train"), inp.get("eval"), out.train, out.eval
)
