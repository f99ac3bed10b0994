# ar2dlm: autoregressive -> diffusion language model conversion, and the four papers' tables.
#   snakemake all_tables --cores 2                                        # embedded default (tiny preset)
#   snakemake all_tables --cores 2 --configfile config/presets/smoke.yaml # seconds per job
#   snakemake prefetch --cores 1 --configfile config/presets/paper.yaml   # where the network is: fills the hub cache
#   snakemake --profile slurm all_tables --configfile config/presets/paper.yaml

from pathlib import Path


# The embedded default, found beside this Snakefile whatever the working directory (--directory).
configfile: Path(workflow.basedir) / "config" / "config.yaml"


# `snakemake --report report.html` after a run: every table, figure and the claims, with captions
report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/teacher.smk"
include: "rules/convert.smk"
include: "rules/evaluate.smk"
include: "rules/armap.smk"
include: "rules/tables.smk"
include: "rules/report.smk"
include: "rules/bench.smk"


# Reports and downloads run where Snakemake runs (login nodes have the network; tables are seconds).
localrules:
    all_tables,
    all_models,
    all_evals,
    all_armap,
    bench,
    eval_summary,
    run_summary,
    study_table,
    study_figure,
    armap_report,
    claims,
    code_benchmark,
    prefetch,


rule all_models:
    """Every conversion run of the preset's grid (model x run x seed)."""
    input:
        [c.manifest for c in CONVERSIONS],


rule all_evals:
    """Every evaluation the studies need (conversion checkpoints and AR teachers)."""
    input:
        eval_outputs(),


rule all_armap:
    """AR-MAP: DPO'd teachers, spectra, gamma searches, DLM DPO baselines and their evaluations."""
    input:
        ARMAP.outputs(),


rule all_tables:
    """Everything the chosen preset produces: the run summary, every conversion run, evaluation, table,
    figure and the claims (the default target: `snakemake --cores 2`, `snakemake --report`)."""
    default_target: True
    input:
        layout.run_summary("md"),
        layout.run_summary("json"),
        rules.all_models.input,
        layout.eval_summary("csv"),
        layout.eval_summary("md"),
        rules.all_armap.input,
        table_outputs(),


rule bench:
    """Benchmarks (decoding and training throughput); not part of all_tables."""
    input:
        layout.bench_result("decode"),
        layout.bench_result("train"),
