import yaml

from ar2dlm.pipeline.resolved import resolve
from ar2dlm.provenance import log_to
from ar2dlm.reporting.tables import (
    TableFiles,
    TableText,
    provenance_footer,
    reported_rows,
    study_header,
    study_table,
    write_table,
)

log_to(snakemake.log[0])
resolved, study, out = resolve(snakemake.params.config), snakemake.wildcards.study, snakemake.output
table, context = study_table(resolved, study)
reported = reported_rows(yaml.safe_load(open(snakemake.input.reported)) or {}, study, resolved.preset)
footer = provenance_footer(context["eval_commits"], resolved.studies[study].spec, context["machines"])
write_table(
    table,
    TableText(study, study_header(context), footer),
    TableFiles(out.md, out.csv, out.tex),
    resolved.preset,
    reported,
)
