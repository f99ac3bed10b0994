from ar2dlm.data.build import build_token_rows, rows_job
from ar2dlm.provenance import log_to

log_to(snakemake.log[0])
w = snakemake.wildcards
if snakemake.rule == "token_rows_shard":  # one of the parallel jobs: its shard
    part = {"shard": int(w.shard), "shards": int(w.shards)}
else:  # the merge of the shards (none: tokenised here)
    part = {"shard_dirs": list(snakemake.input.shards)}
job = rows_job(snakemake.input.source, snakemake.input.tokenizer, w.source, w.selection, int(w.seq_len))
print(build_token_rows(job, snakemake.output[0], workers=snakemake.threads, **part))
