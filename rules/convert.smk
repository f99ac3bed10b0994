# Conversion stage: every run of the grid, per model and seed. Checkpoints step_<k>/ are written
# beside the declared train.json and are not Snakemake outputs, so a failed or killed job leaves
# them in place and its rerun resumes from the last one.


rule convert:
    """Train one conversion run (model, run, seed): HF checkpoints every K steps plus a manifest."""
    input:
        teacher=layout.teacher_dir(),
        corpus=lambda wc: RESOLVED.conversion_corpus(wc.run),
        # a staged run (init: {run: NAME}) starts from that run's final checkpoint, same model and seed
        init=lambda wc: RESOLVED.init_manifest(wc.model, wc.run, wc.seed),
    output:
        layout.conversion_manifest(),
    log:
        layout.log_path("convert/{model}_{run}_seed{seed}"),
    benchmark:
        layout.bench_path("convert/{model}_{run}_seed{seed}")
    retries: CLUSTER.conversion_retries()
    conda:
        "../envs/ar2dlm.yaml"
    # one thread per job: on CPUs the tiny model trains faster as parallel one-thread jobs than as one
    # multi-threaded job at a time (small matrices); GPU jobs get their CPUs from the SLURM profile
    threads: 1
    resources:
        **CLUSTER.conversion_resources(),
    params:
        run=lambda wc: json.dumps(RESOLVED.conversion_settings(wc.run), sort_keys=True),
        preset=config["preset"],
        # one process per GPU of the job (the SLURM profile grants them); a plain process without GPUs
        launcher=lambda wc, resources: launcher(resources, PYTHON),
        launch=CLUSTER.conversion_launch,
        init=lambda wc, input: f"--init-from {json.dumps(input.init[0])}" if input.init else "",
    shell:
        "{params.launcher} -m ar2dlm.training.convert_run --settings {params.run:q} --teacher {input.teacher:q} "
        "--corpus {input.corpus:q} --out {output:q} --seed {wildcards.seed} --preset {params.preset} "
        "--model {wildcards.model} --job-log {log:q} --threads {threads} --launch {params.launch:q} {params.init}"
