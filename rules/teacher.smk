# AR teacher stage: pretrain a small Qwen3 here, or fetch Qwen3-*-Base; then check it.


rule teacher:
    """The AR teacher as a Hugging Face folder with its conventions and provenance JSON."""
    input:
        unpack(teacher_inputs),
    output:
        model=directory(layout.teacher_dir()),
        loss_log=layout.teacher_loss_log(),
    log:
        layout.log_path("teacher/{model}"),
    benchmark:
        layout.bench_path("teacher/{model}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 8
    params:
        model_cfg=lambda wc: config["models"][wc.model],
        seed=config["seed"],
        preset=config["preset"],
    script:
        "../workflow_scripts/teacher.py"


rule eval_teacher_code:
    """Held-out loss and greedy pass@1 (evalplus) of the teacher on the held-out code suite."""
    input:
        model=layout.teacher_dir(),
        code_eval=layout.suite_file("code", "eval"),
        math_eval=layout.suite_file("math", "eval"),
    output:
        layout.teacher_check_path(),
    log:
        layout.log_path("eval/teacher_check_{model}"),
    benchmark:
        layout.bench_path("eval/teacher_check_{model}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 8
    params:
        cfg=config["eval"]["teacher_code"],
    script:
        "../workflow_scripts/eval_teacher.py"
