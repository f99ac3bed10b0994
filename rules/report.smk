# Report stage: what the chosen preset has produced, as Markdown and JSON.


rule run_summary:
    """Run summary: data sizes, teachers (provenance, held-out loss, pass@1)."""
    input:
        evals=expand(teacher_check_path(), model=MODELS),
        teachers=expand(teacher_dir(), model=MODELS),
        corpus=data_path("corpus", "manifest.json"),
        preferences=expand(data_path("preferences", "{domain}", "eval.jsonl"), domain=PREF_DOMAINS),
    output:
        markdown=f"{RESULTS}/summary.md",
        json=f"{RESULTS}/summary.json",
    params:
        preset=config["preset"],
        models=MODELS,
    log:
        log_path("report/run_summary"),
    benchmark:
        bench_path("report/run_summary"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/run_summary.py"


rule eval_summary:
    """Every evaluation the studies asked for, one table (long CSV, Markdown by benchmark)."""
    input:
        eval_outputs(),
        [p for p in armap_outputs() if "/eval/" in p],
    output:
        csv=f"{RESULTS}/eval/summary.csv",
        markdown=f"{RESULTS}/eval/summary.md",
    params:
        preset=config["preset"],
    log:
        log_path("report/eval_summary"),
    benchmark:
        bench_path("report/eval_summary"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/eval_summary.py"
