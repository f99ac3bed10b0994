from ar2dlm.data.build import build_suites
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
out = snakemake.output
print(build_suites(snakemake.params.data, out.code_train, out.code_eval, out.math_train, out.math_eval))
