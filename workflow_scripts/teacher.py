from ar2dlm.provenance import log_to
from ar2dlm.training.teacher import TeacherJob, fetch_teacher, pretrain_teacher

log_to(snakemake.log[0], snakemake.threads)
p, out = snakemake.params, snakemake.output
job = TeacherJob(p.model_cfg, p.seed, p.preset)
if p.model_cfg["source"] == "pretrain":
    info = pretrain_teacher(job, snakemake.input.tokenizer, snakemake.input.corpus, out.model, out.loss_log)
else:
    info = fetch_teacher(job, out.model)
    open(out.loss_log, "w").write("step,loss\n")  # a fetched teacher has no pretraining log
print(info)
