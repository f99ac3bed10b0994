from ar2dlm.data.build import build_suites
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
print(build_suites(snakemake.params.data, dict(snakemake.output.items())))
