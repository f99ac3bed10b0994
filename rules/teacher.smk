# AR teacher stage: pretrain a small Qwen3 here, or fetch Qwen3-*-Base; then check it.


rule teacher:
    """The AR teacher as a Hugging Face folder with its conventions and provenance JSON."""
    input:
        unpack(teacher_inputs),
    output:
        model=directory(teacher_dir()),
        loss_log=f"{RESULTS}/logs/teacher/{{model}}_loss.csv",
    params:
        model_cfg=lambda wc: config["models"][wc.model],
        seed=config["seed"],
        preset=config["preset"],
    threads: 8
    log:
        log_path("teacher/{model}"),
    benchmark:
        bench_path("teacher/{model}"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/teacher.py"


rule eval_teacher_code:
    """Held-out loss and greedy pass@1 (evalplus) of the teacher on the held-out code suite."""
    input:
        model=teacher_dir(),
        code_eval=data_path("code", "eval.jsonl"),
        math_eval=data_path("math", "eval.jsonl"),
    output:
        teacher_check_path(),
    params:
        cfg=config["eval"]["teacher_code"],
    threads: 8
    log:
        log_path("eval/teacher_check_{model}"),
    benchmark:
        bench_path("eval/teacher_check_{model}"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/eval_teacher.py"
