# Report stage: what the chosen preset has produced, as Markdown and JSON.


rule run_summary:
    """Run summary: data sizes, teachers (provenance, held-out loss, pass@1)."""
    input:
        evals=expand(layout.teacher_check_path(), model=MODELS),
        teachers=expand(layout.teacher_dir(), model=MODELS),
        corpus=layout.corpus_file("manifest"),
        preferences=expand(layout.preference_file("{domain}", "eval"), domain=PREF_DOMAINS),
    output:
        markdown=report(
            layout.run_summary("md"),
            caption=str(Path(workflow.basedir) / "report" / "run_summary.rst"),
            category="Summaries",
        ),
        json=layout.run_summary("json"),
    log:
        layout.log_path("report/run_summary"),
    benchmark:
        layout.bench_path("report/run_summary")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        preset=config["preset"],
        models=MODELS,
    script:
        "../workflow_scripts/run_summary.py"


rule eval_summary:
    """Every evaluation the studies asked for, one table (long CSV, Markdown by benchmark)."""
    input:
        eval_outputs(),
        [j.path for j in ARMAP.evals],
    output:
        csv=report(
            layout.eval_summary("csv"),
            caption=str(Path(workflow.basedir) / "report" / "eval_summary.rst"),
            category="Summaries",
        ),
        markdown=report(
            layout.eval_summary("md"),
            caption=str(Path(workflow.basedir) / "report" / "eval_summary.rst"),
            category="Summaries",
        ),
    log:
        layout.log_path("report/eval_summary"),
    benchmark:
        layout.bench_path("report/eval_summary")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        preset=config["preset"],
    script:
        "../workflow_scripts/eval_summary.py"
