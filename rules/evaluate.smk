# Evaluation stage: every (benchmark, model, run, seed, step) the studies need, and the AR teacher on
# every benchmark a study uses. One script for all kinds; the model's conventions JSON says how to
# decode it, so DPO'd and merged models go through the same rules.


rule evaluate_checkpoint:
    """One conversion checkpoint on one benchmark."""
    input:
        unpack(benchmark_inputs),
        manifest=layout.conversion_manifest(),
    output:
        layout.eval_path(),
    log:
        layout.log_path("eval/{benchmark}_{model}_{run}_seed{seed}_step{step}"),
    benchmark:
        layout.bench_path("eval/{benchmark}_{model}_{run}_seed{seed}_step{step}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    params:
        spec=lambda wc: RESOLVED.benchmarks[wc.benchmark].settings,
    script:
        "../workflow_scripts/evaluate.py"


rule evaluate_teacher:
    """The AR teacher on one benchmark, under the same harness."""
    input:
        unpack(benchmark_inputs),
        model=layout.teacher_dir(),
    output:
        layout.eval_path(run="teacher"),
    log:
        layout.log_path("eval/{benchmark}_{model}_teacher"),
    benchmark:
        layout.bench_path("eval/{benchmark}_{model}_teacher")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    params:
        spec=lambda wc: RESOLVED.benchmarks[wc.benchmark].settings,
        seed=config["seed"],
    script:
        "../workflow_scripts/evaluate.py"
