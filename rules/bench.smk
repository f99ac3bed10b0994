# Benchmarks: decoding throughput (not part of all_tables; `snakemake bench`).


rule bench_decode:
    """Tokens/s of AR KV-cached decoding vs DLM block decoding with and without the exact cache."""
    input:
        dlm=layout.conversion_manifest(config["bench"]["model"], config["bench"]["run"], config["seed"]),
        teacher=layout.teacher_dir(config["bench"]["model"]),
        prompts=layout.suite_file("code", "eval"),
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
        script=os.path.join(workflow.basedir, "benchmarks", "decode.py"),
        b=config["bench"],
        lengths=",".join(map(str, config["bench"]["lengths"])),
        cache_lengths=",".join(map(str, config["bench"]["cache_lengths"])),
        thresholds=",".join(map(str, config["bench"]["thresholds"])),
    shell:
        "python {params.script} --model $(dirname {input.dlm}) --ar-model {input.teacher} --prompts {input.prompts}"
        " --out {output} --threads {threads} --batch-size {params.b[batch_size]}"
        " --block-size {params.b[block_size]} --lengths {params.lengths} --cache-lengths {params.cache_lengths}"
        " --thresholds {params.thresholds} --ratio-length {params.b[ratio_length]}"
        " --reference-threshold {params.b[reference_threshold]} --task-prompts {params.b[task_prompts]}"
        " --max-new-tokens {params.b[max_new_tokens]} > {log} 2>&1"


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
    params:
        script=os.path.join(workflow.basedir, "benchmarks", "train.py"),
        preset=config["preset"],
    shell:
        "python {params.script} --teacher {input.teacher} --corpus {input.corpus} --preset {params.preset}"
        " --out {output} --threads {threads} --manifests {input.manifests} > {log} 2>&1"
