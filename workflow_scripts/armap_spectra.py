from ar2dlm.armap.pipeline import spectra
from ar2dlm.provenance import log_to, read_json

log_to(snakemake.log[0], snakemake.threads)
inp, out, wc = snakemake.input, snakemake.output, snakemake.wildcards
dlm = f"{inp.manifest.rsplit('/', 1)[0]}/step_{read_json(inp.manifest)['steps']}"
spectra(inp.teacher, inp.dpo, dlm, out.csv, out.pdf, out.png,
        f"spectral shadowing: {wc.model} {wc.run} seed {wc.seed}, preference domain {wc.pdomain}")
