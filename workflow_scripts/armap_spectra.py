from ar2dlm.armap.pipeline import spectra
from ar2dlm.provenance import log_to
from ar2dlm.pipeline.layout import final_checkpoint

log_to(snakemake.log[0], snakemake.threads)
inp, out, wc = snakemake.input, snakemake.output, snakemake.wildcards
dlm = final_checkpoint(inp.manifest)
spectra(inp.teacher, inp.dpo, dlm, out.csv, out.pdf, out.png,
        f"spectral shadowing: {wc.model} {wc.run} seed {wc.seed}, preference domain {wc.pdomain}")
