# Tables, figures and claims: rebuilt from the evaluation JSONs of the chosen preset. Each study is
# one table (Markdown, CSV, LaTeX); a study with a figure kind also gets a figure (PDF, PNG).


rule study_table:
    """One study as a table, the papers' reported numbers listed beside it with their source."""
    input:
        lambda wc: study_inputs(RESOLVED, wc.study),
        reported=ancient(str(Path(workflow.basedir) / "config" / "reported.yaml")),
    output:
        md=report(
            layout.study_table(fmt="md"),
            caption=str(Path(workflow.basedir) / "report" / "caption.rst"),
            category="Tables",
            subcategory="{study}",
        ),
        csv=report(
            layout.study_table(fmt="csv"),
            caption=str(Path(workflow.basedir) / "report" / "caption.rst"),
            category="Tables",
            subcategory="{study}",
        ),
        tex=layout.study_table(fmt="tex"),
    log:
        layout.log_path("tables/{study}"),
    benchmark:
        layout.bench_path("tables/{study}")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        config=lambda wc: RESOLVED.study_config(wc.study),
        caption=lambda wc: study_table_caption(RESOLVED, wc.study),
    script:
        "../workflow_scripts/study_table.py"


rule study_figure:
    """A study's figure: results/figures/<study>.pdf/png (the ablations' under results/ablations/)."""
    input:
        lambda wc: study_inputs(RESOLVED, FIGURES[wc.figpath]),
    output:
        pdf=layout.study_figure(fmt="pdf"),
        png=report(
            layout.study_figure(fmt="png"),
            caption=str(Path(workflow.basedir) / "report" / "caption.rst"),
            category="Figures",
            subcategory="{figpath}",
        ),
    log:
        layout.log_path("figures/{figpath}"),
    benchmark:
        layout.bench_path("figures/{figpath}")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        study=lambda wc: FIGURES[wc.figpath],
        config=lambda wc: RESOLVED.study_config(FIGURES[wc.figpath]),
        caption=lambda wc: study_figure_caption(RESOLVED, FIGURES[wc.figpath]),
    script:
        "../workflow_scripts/study_figure.py"


rule armap_report:
    """AR-MAP: main table (AR-MAP's reported numbers under it), merges table, reward accuracy against gamma,
    spectral shadowing."""
    input:
        armap_report_inputs(RESOLVED),
        reported=ancient(str(Path(workflow.basedir) / "config" / "reported.yaml")),
    output:
        main=report(
            layout.armap_table("main", "md"),
            caption=str(Path(workflow.basedir) / "report" / "armap_main.rst"),
            category="Tables",
            subcategory="armap",
        ),
        main_csv=report(
            layout.armap_table("main", "csv"),
            caption=str(Path(workflow.basedir) / "report" / "armap_main.rst"),
            category="Tables",
            subcategory="armap",
        ),
        main_tex=layout.armap_table("main", "tex"),
        merges=report(
            layout.armap_table("merges", "md"),
            caption=str(Path(workflow.basedir) / "report" / "armap_merges.rst"),
            category="Tables",
            subcategory="armap",
        ),
        merges_csv=report(
            layout.armap_table("merges", "csv"),
            caption=str(Path(workflow.basedir) / "report" / "armap_merges.rst"),
            category="Tables",
            subcategory="armap",
        ),
        merges_tex=layout.armap_table("merges", "tex"),
        gamma_pdf=layout.armap_figure("gamma", "pdf"),
        gamma_png=report(
            layout.armap_figure("gamma", "png"),
            caption=str(Path(workflow.basedir) / "report" / "armap_gamma.rst"),
            category="Figures",
            subcategory="armap",
        ),
        shadow_pdf=layout.armap_figure("shadowing", "pdf"),
        shadow_png=report(
            layout.armap_figure("shadowing", "png"),
            caption=str(Path(workflow.basedir) / "report" / "armap_shadowing.rst"),
            category="Figures",
            subcategory="armap",
        ),
    log:
        layout.log_path("tables/armap"),
    benchmark:
        layout.bench_path("tables/armap")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        config=lambda wc: {
            k: config[k]
            for k in ("preset", "armap", "runs", "training", "models", "seed", "eval", "methods")
            if k in config
        },
    script:
        "../workflow_scripts/armap_report.py"


rule claims:
    """Every directional claim of the four papers: effect, spread over seeds, verdict, and the
    budget-sensitive ones' effects against the training step."""
    input:
        claim_inputs(RESOLVED),
    output:
        md=report(
            layout.claims_file("md"), caption=str(Path(workflow.basedir) / "report" / "claims.rst"), category="Claims"
        ),
        csv=report(
            layout.claims_file("csv"), caption=str(Path(workflow.basedir) / "report" / "claims.rst"), category="Claims"
        ),
        by_step_pdf=layout.claims_by_step_figure("pdf"),
        by_step_png=report(
            layout.claims_by_step_figure("png"),
            caption=str(Path(workflow.basedir) / "report" / "claims_by_step.rst"),
            category="Claims",
        ),
    log:
        layout.log_path("tables/claims"),
    benchmark:
        layout.bench_path("tables/claims")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        config=lambda wc: {
            k: config[k]
            for k in ("preset", "armap", "runs", "training", "models", "seed", "eval", "studies", "claims", "methods")
            if k in config
        },
    script:
        "../workflow_scripts/claims.py"
