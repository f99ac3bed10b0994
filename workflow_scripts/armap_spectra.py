from ar2dlm.armap.pipeline import ArmapFolders, spectra
from ar2dlm.core.models import final_checkpoint
from ar2dlm.provenance import log_to
from ar2dlm.reporting.armap import plot_shadowing

log_to(snakemake.log[0], snakemake.threads)
inp, out, wc = snakemake.input, snakemake.output, snakemake.wildcards
table = spectra(ArmapFolders(inp.teacher, inp.dpo, final_checkpoint(inp.manifest)), out.csv)
plot_shadowing(
    table, f"spectral shadowing: {wc.model} {wc.run} seed {wc.seed}, preference domain {wc.pdomain}", out.pdf, out.png
)
