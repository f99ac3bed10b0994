from ar2dlm.provenance import log_to
from ar2dlm.training.teacher import fetch_teacher, pretrain_teacher

log_to(snakemake.log[0], snakemake.threads)
p, out = snakemake.params, snakemake.output
if p.model_cfg["source"] == "pretrain":
    info = pretrain_teacher(
        p.model_cfg, snakemake.input.tokenizer, snakemake.input.corpus, out.model, out.loss_log, p.seed, p.preset
    )
else:
    info = fetch_teacher(p.model_cfg, out.model, p.seed, p.preset)
    open(out.loss_log, "w").write("step,loss\n")  # a fetched teacher has no pretraining log
print(info)
