# Tables, figures and claims: rebuilt from the evaluation JSONs of the chosen preset. Each study is
# one table (Markdown, CSV, LaTeX); a study with a figure kind also gets a figure (PDF, PNG).


rule study_table:
    """One study as a table, the papers' reported numbers listed beside it with their source."""
    input:
        lambda wc: study_inputs(config, wc.study, RESULTS),
        reported=ancient(str(Path(workflow.basedir) / "config" / "reported.yaml")),
    output:
        md=report(f"{RESULTS}/tables/{{study}}.md", category="Tables", subcategory="{study}"),
        csv=f"{RESULTS}/tables/{{study}}.csv",
        tex=f"{RESULTS}/tables/{{study}}.tex",
    params:
        config=lambda wc: study_config(wc.study),
    log:
        log_path("tables/{study}"),
    benchmark:
        bench_path("tables/{study}")
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/study_table.py"


rule study_figure:
    """A study's figure: results/figures/<study>.pdf/png (the ablations' under results/ablations/)."""
    input:
        lambda wc: study_inputs(config, FIGURES[wc.figpath], RESULTS),
    output:
        pdf=f"{RESULTS}/{{figpath}}.pdf",
        png=report(f"{RESULTS}/{{figpath}}.png", category="Figures", subcategory="{figpath}"),
    params:
        study=lambda wc: FIGURES[wc.figpath],
        config=lambda wc: study_config(FIGURES[wc.figpath]),
    log:
        log_path("figures/{figpath}"),
    benchmark:
        bench_path("figures/{figpath}")
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/study_figure.py"


rule armap_report:
    """AR-MAP: main table, merges table, reward accuracy against gamma, spectral shadowing."""
    input:
        armap_report_inputs(config, RESULTS),
    output:
        main=report(f"{RESULTS}/tables/armap/main.md", category="Tables", subcategory="armap"),
        main_csv=f"{RESULTS}/tables/armap/main.csv",
        main_tex=f"{RESULTS}/tables/armap/main.tex",
        merges=report(f"{RESULTS}/tables/armap/merges.md", category="Tables", subcategory="armap"),
        merges_csv=f"{RESULTS}/tables/armap/merges.csv",
        merges_tex=f"{RESULTS}/tables/armap/merges.tex",
        gamma_pdf=f"{RESULTS}/figures/armap/gamma.pdf",
        gamma_png=report(f"{RESULTS}/figures/armap/gamma.png", category="Figures", subcategory="armap"),
        shadow_pdf=f"{RESULTS}/figures/armap/shadowing.pdf",
        shadow_png=report(f"{RESULTS}/figures/armap/shadowing.png", category="Figures", subcategory="armap"),
    params:
        config=lambda wc: {k: config[k] for k in ("preset", "armap", "runs", "training", "models", "seed", "eval")},
    log:
        log_path("tables/armap"),
    benchmark:
        bench_path("tables/armap")
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/armap_report.py"


rule claims:
    """Every directional claim of the four papers: effect, spread over seeds, verdict."""
    input:
        claim_inputs(config, RESULTS),
    output:
        md=report(f"{RESULTS}/claims.md", category="Claims"),
        csv=f"{RESULTS}/claims.csv",
    params:
        config=lambda wc: {k: config[k] for k in ("preset", "armap", "runs", "training", "models", "seed", "eval",
                                                  "studies")},
    log:
        log_path("tables/claims"),
    benchmark:
        bench_path("tables/claims")
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/claims.py"
