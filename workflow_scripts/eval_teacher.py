from ar2dlm.evaluation.teacher import evaluate_teacher
from ar2dlm.provenance import log_to, write_json

log_to(snakemake.log[0], snakemake.threads)
inp = snakemake.input
result = evaluate_teacher(inp.model, inp.code_eval, inp.math_eval, snakemake.params.cfg)
write_json(snakemake.output[0], result)
