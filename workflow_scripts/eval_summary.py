from pathlib import Path

from ar2dlm.provenance import log_to
from ar2dlm.reporting.summaries import eval_summary

log_to(snakemake.log[0])
markdown, table = eval_summary(snakemake.params.preset, list(snakemake.input))
table.to_csv(snakemake.output.csv, index=False)
Path(snakemake.output.markdown).write_text(markdown)
