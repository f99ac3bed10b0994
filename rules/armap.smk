# AR-MAP stage: DPO on the AR teacher (TRL), the preference and diffusion task vectors' spectra,
# the reward-guided gamma search per domain and merge, and the baselines trained directly on the DLM
# (DPO with VRPO's estimator; plain DLM DPO and SimPO where armap.dlm_plain_dpo and armap.dlm_simpo
# are configured). The models
# it writes carry their conventions JSON and go through the evaluation rules like any other.


rule dpo_teacher:
    """DPO of the AR teacher on one preference domain, or on all of them together, with one AR-MAP
    seed (TRL; full DPO that one GPU cannot hold: the FSDP2 trainer under torchrun, as planned)."""
    input:
        model=layout.teacher_dir(),
        train=preference_files("train"),
        eval=preference_files("eval"),
    output:
        directory(layout.teacher_dpo_dir()),
    log:
        layout.log_path("armap/dpo_teacher_{model}_{pdomain}_seed{seed}"),
    benchmark:
        layout.bench_path("armap/dpo_teacher_{model}_{pdomain}_seed{seed}")
    # a run planned in segments: each job stops with a checkpoint before its runtime, the retry resumes
    retries: CLUSTER.dpo_retries("dpo_teacher")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    resources:
        **CLUSTER.dpo_resources(),
    params:
        cfg=json.dumps(config["armap"]["dpo"]),
        domains=preference_domains,
        launcher=lambda wc, resources: launcher(resources, PYTHON),
        launch=CLUSTER.dpo_launch,
    shell:
        "{params.launcher} -m ar2dlm.armap.dpo_run --model {input.model:q} --train {input.train:q} "
        "--domains {params.domains:q} --eval {input.eval:q} --settings {params.cfg:q} --seed {wildcards.seed} "
        "--out {output:q} --job-log {log:q} --threads {threads} --launch {params.launch:q}"


rule armap_spectra:
    """Singular-value statistics of tau_pref and tau_diffusion per matrix, and the shadowing figure."""
    input:
        teacher=layout.teacher_dir(),
        dpo=layout.teacher_dpo_dir(),
        manifest=layout.conversion_manifest(),
    output:
        csv=layout.spectra_csv(),
        pdf=layout.spectra_figure("pdf"),
        png=layout.spectra_figure("png"),
    log:
        layout.log_path("armap/spectra_{model}_{run}_seed{seed}_{pdomain}"),
    benchmark:
        layout.bench_path("armap/spectra_{model}_{run}_seed{seed}_{pdomain}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    resources:
        **CLUSTER.armap_runtime("armap_spectra"),
    script:
        "../workflow_scripts/armap_spectra.py"


rule gamma_search:
    """Batch reward accuracy against gamma on held-out pairs; the merge at gamma_hat as a DLM folder."""
    input:
        teacher=layout.teacher_dir(),
        dpo=layout.teacher_dpo_dir(),
        manifest=layout.conversion_manifest(),
        eval=preference_files("eval"),
    output:
        curve=layout.gamma_curve(),
        model=directory(layout.armap_model_dir()),
    log:
        layout.log_path("armap/gamma_{model}_{run}_seed{seed}_{pdomain}_{merge}"),
    benchmark:
        layout.bench_path("armap/gamma_{model}_{run}_seed{seed}_{pdomain}_{merge}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    resources:
        **CLUSTER.armap_runtime("gamma_search"),
    params:
        # pairs cut to the length the preference vector's DPO trained on
        cfg={
            "gamma": config["armap"]["gamma"],
            "merges": config["armap"]["merges"],
            "max_length": config["armap"]["dpo"]["max_length"],
        },
    script:
        "../workflow_scripts/gamma_search.py"


rule dlm_preference:
    """A baseline: the DLM preference-optimised directly on ELBO log-likelihoods, same pairs
    (``objective`` dpo: VRPO's estimator, sharded like dpo_teacher when planned so; simpo: TRL's CPO
    trainer on one GPU)."""
    input:
        manifest=layout.conversion_manifest(),
        train=preference_files("train"),
        eval=preference_files("eval"),
    output:
        directory(layout.direct_dir()),
    log:
        layout.log_path("armap/dlm_{objective}_{model}_{run}_seed{seed}_{pdomain}"),
    benchmark:
        layout.bench_path("armap/dlm_{objective}_{model}_{run}_seed{seed}_{pdomain}")
    # a run planned in segments: each job stops with a checkpoint before its runtime, the retry resumes
    retries: CLUSTER.dpo_retries(*(f"dlm_{o}" for o in direct_objectives(config["armap"])))
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    resources:
        **CLUSTER.dpo_resources(),
    params:
        cfg=lambda wc: json.dumps(direct_settings(config["armap"], wc.objective)),
        domains=preference_domains,
        launcher=lambda wc, resources: launcher(resources, PYTHON),
        launch=CLUSTER.dpo_launch,
    shell:
        "{params.launcher} -m ar2dlm.armap.dpo_run --manifest {input.manifest:q} --train {input.train:q} "
        "--domains {params.domains:q} --eval {input.eval:q} --settings {params.cfg:q} --seed {wildcards.seed} "
        "--out {output:q} --job-log {log:q} --threads {threads} --launch {params.launch:q}"


rule evaluate_armap_model:
    """A merged model at gamma_hat on one benchmark."""
    input:
        unpack(benchmark_inputs),
        model=layout.armap_model_dir(),
    output:
        layout.derived_eval_path(name=layout.armap_name()),
    log:
        layout.log_path("eval/{benchmark}_{model}_{run}_seed{seed}_armap_{pdomain}_{merge}"),
    benchmark:
        layout.bench_path("eval/{benchmark}_{model}_{run}_seed{seed}_armap_{pdomain}_{merge}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    params:
        spec=lambda wc: RESOLVED.benchmarks[wc.benchmark].settings,
    script:
        "../workflow_scripts/evaluate.py"


rule evaluate_dlm_preference:
    """A DLM preference-optimised directly (a baseline) on one benchmark."""
    input:
        unpack(benchmark_inputs),
        model=layout.direct_dir(),
    output:
        layout.derived_eval_path(name=layout.direct_name()),
    log:
        layout.log_path("eval/{benchmark}_{model}_{run}_seed{seed}_dlm_{objective}_{pdomain}"),
    benchmark:
        layout.bench_path("eval/{benchmark}_{model}_{run}_seed{seed}_dlm_{objective}_{pdomain}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    params:
        spec=lambda wc: RESOLVED.benchmarks[wc.benchmark].settings,
    script:
        "../workflow_scripts/evaluate.py"


rule evaluate_teacher_dpo:
    """A DPO'd AR teacher on one benchmark."""
    input:
        unpack(benchmark_inputs),
        model=layout.teacher_dpo_dir(),
    output:
        layout.teacher_dpo_eval_path(),
    log:
        layout.log_path("eval/{benchmark}_{model}_teacher_dpo_{pdomain}_seed{seed}"),
    benchmark:
        layout.bench_path("eval/{benchmark}_{model}_teacher_dpo_{pdomain}_seed{seed}")
    conda:
        "../envs/ar2dlm.yaml"
    threads: 1
    params:
        spec=lambda wc: RESOLVED.benchmarks[wc.benchmark].settings,
    script:
        "../workflow_scripts/evaluate.py"
