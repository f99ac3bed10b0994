from pathlib import Path

from ar2dlm.evaluation.problems import benchmark_problems
from ar2dlm.pipeline.layout import evalplus_cache
from ar2dlm.provenance import log_to, write_jsonl

log_to(snakemake.log[0], snakemake.threads)
out = Path(snakemake.output[0])
suite = snakemake.input[0] if snakemake.input else None
problems = benchmark_problems(snakemake.wildcards.benchmark, snakemake.params.spec, suite, evalplus_cache())
write_jsonl(out, problems)
