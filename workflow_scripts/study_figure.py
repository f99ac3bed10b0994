from ar2dlm.pipeline.resolved import resolve
from ar2dlm.provenance import log_to
from ar2dlm.reporting.figures import study_figure

log_to(snakemake.log[0])
study_figure(resolve(snakemake.params.config), snakemake.params.study, snakemake.output.pdf, snakemake.output.png)
