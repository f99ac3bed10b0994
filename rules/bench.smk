# Benchmarks: decoding throughput (not part of all_tables; `snakemake bench`).


rule bench_decode:
    """The DLM against its AR teacher on real responses: tokens/s, tokens per forward and pass@1
    per decoder (the decode engine, transformers' generate, the DynamicCache path), milliseconds
    per forward kind, and the cost of a forward by the positions it computes."""
    input:
        dlm=layout.conversion_manifest(config["bench"]["model"], config["bench"]["run"], config["seed"]),
        teacher=layout.teacher_dir(config["bench"]["model"]),
        problems=layout.benchmark_problems(config["bench"]["benchmark"]),
    output:
        layout.bench_result("decode"),
    log:
        layout.log_path("bench/decode"),
    benchmark:
        layout.bench_path("bench/decode")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 8
    params:
        python=PYTHON,
        script=os.path.join(workflow.basedir, "benchmarks", "decode.py"),
        b=config["bench"],
        spec=RESOLVED.benchmarks[config["bench"]["benchmark"]].settings,
        thresholds=",".join(map(str, config["bench"]["thresholds"])),
        cost_tokens=",".join(map(str, config["bench"]["cost_tokens"])),
        flags=" ".join(
            f
            for f, on in (
                ("--compile", config["bench"]["compile"]),
                ("--cost-qwen3-0.6b", config["bench"]["cost_qwen3_0_6b"]),
            )
            if on
        ),
    shell:
        "{params.python} {params.script} --model $(dirname {input.dlm}) --ar-model {input.teacher} --problems {input.problems}"
        " --out {output} --threads {threads} --batch-size {params.b[batch_size]} --thresholds {params.thresholds}"
        " --task-prompts {params.b[task_prompts]} --max-new-tokens {params.b[max_new_tokens]}"
        " --repeats {params.b[repeats]} --cost-tokens {params.cost_tokens} --cost-context {params.b[cost_context]}"
        " --style {params.spec[style]} --format {params.spec[format]} --dataset {params.spec[dataset]}"
        " --parallel {params.spec[parallel]} --dtype {params.b[dtype]} {params.flags} > {log} 2>&1"


rule bench_train:
    """Training tokens/s: frozen vs full, repr_align vs mdlm; wall time of every conversion run."""
    input:
        teacher=layout.teacher_dir(config["bench"]["model"]),
        corpus=layout.corpus_file("subset"),
        manifests=[layout.conversion_manifest(m, r, s) for m, r, s in CONVERSIONS],
    output:
        layout.bench_result("train"),
    log:
        layout.log_path("bench/train"),
    benchmark:
        layout.bench_path("bench/train")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 8
    resources:
        **CLUSTER.bench_train_resources(),
    params:
        script=os.path.join(workflow.basedir, "benchmarks", "train.py"),
        preset=config["preset"],
        # the planned launch of the bench model's largest timed run: one process per GPU, sharded as planned
        launcher=lambda wc, resources: launcher(resources, PYTHON),
        launch=CLUSTER.bench_train_launch(),
    shell:
        "{params.launcher} {params.script} --teacher {input.teacher} --corpus {input.corpus} --preset {params.preset}"
        " --out {output} --threads {threads} --launch {params.launch:q} --manifests {input.manifests} > {log} 2>&1"
