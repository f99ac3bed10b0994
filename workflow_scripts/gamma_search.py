from ar2dlm.armap.gamma import GammaSearch
from ar2dlm.armap.pipeline import ArmapFolders, preference_rows, search
from ar2dlm.core.models import final_checkpoint
from ar2dlm.provenance import log_to

log_to(snakemake.log[0], snakemake.threads)
inp, out, wc, p = snakemake.input, snakemake.output, snakemake.wildcards, snakemake.params
dlm = final_checkpoint(inp.manifest)
cfg = {**p.cfg["gamma"], "merges": p.cfg["merges"], "max_length": p.cfg["max_length"]}
search(
    ArmapFolders(inp.teacher, inp.dpo, dlm),
    preference_rows(inp.eval, cfg["eval_pairs"]),
    GammaSearch.from_config(cfg, wc.merge, int(wc.seed)),
    out.curve,
    out.model,
)
