from ar2dlm.data.build import build_tokenizer
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
inp = snakemake.input
print("vocabulary:", build_tokenizer(snakemake.params.data, inp.code_train, inp.math_train, snakemake.output[0]))
