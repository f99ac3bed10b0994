from pathlib import Path

from ar2dlm.provenance import log_to, write_json
from ar2dlm.reporting.summaries import run_summary

log_to(snakemake.log[0])
inp, p = snakemake.input, snakemake.params
markdown, summary = run_summary(p.preset, p.models, inp.evals, inp.teachers, inp.corpus, inp.preferences)
write_json(snakemake.output.json, summary)
Path(snakemake.output.markdown).write_text(markdown)
