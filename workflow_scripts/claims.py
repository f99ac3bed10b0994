from pathlib import Path

from ar2dlm.pipeline.resolved import resolve
from ar2dlm.provenance import log_to
from ar2dlm.reporting.claims import claims_markdown, evaluate_claims
from ar2dlm.reporting.figures import effect_curves_figure

log_to(snakemake.log[0])
resolved = resolve(snakemake.params.config)
df, curves = evaluate_claims(resolved)
df.to_csv(snakemake.output.csv, index=False)
Path(snakemake.output.md).write_text(claims_markdown(df, resolved.preset))
effect_curves_figure(curves, snakemake.output.by_step_pdf, snakemake.output.by_step_png)
