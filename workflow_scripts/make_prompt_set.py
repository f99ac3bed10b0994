from ar2dlm.data.build import build_prompt_set
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
p = snakemake.params
print(build_prompt_set(snakemake.wildcards.pset, p.spec, p.seed, snakemake.output[0]), "prompts")
