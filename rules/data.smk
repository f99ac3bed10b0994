# Data stage: synthetic suites, preference pairs, tokenizer, pretraining corpus (subset + stream).


rule synthetic_suites:
    """HumanEval+-format code suite and arithmetic suite, train and held-out eval."""
    output:
        code_train=data_path("code", "train.jsonl"),
        code_eval=data_path("code", "eval.jsonl"),
        math_train=data_path("math", "train.jsonl"),
        math_eval=data_path("math", "eval.jsonl"),
    params:
        data={k: config["data"][k] for k in ("seed", "code_suite", "math_suite")},
    log:
        log_path("data/synthetic_suites"),
    benchmark:
        bench_path("data/synthetic_suites"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/make_suites.py"


rule preferences:
    """Preference pairs (prompt, chosen, rejected) of one domain, train and held-out."""
    input:
        unpack(preference_inputs),
    output:
        train=data_path("preferences", "{domain}", "train.jsonl"),
        eval=data_path("preferences", "{domain}", "eval.jsonl"),
    params:
        data={k: config["data"][k] for k in ("seed", "preferences")},
    log:
        log_path("data/preferences_{domain}"),
    benchmark:
        bench_path("data/preferences_{domain}"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/make_preferences.py"


rule tokenizer:
    """Byte-level BPE trained on the corpus text, or the pretrained tokenizer plus a mask token."""
    input:
        code_train=data_path("code", "train.jsonl"),
        math_train=data_path("math", "train.jsonl"),
    output:
        directory(data_path("tokenizer")),
    params:
        data={
            "seed": config["data"]["seed"],
            "tokenizer": config["data"]["tokenizer"],
            "corpus": {"stdlib_files": config["data"]["corpus"]["stdlib_files"]},
        },
    log:
        log_path("data/tokenizer"),
    benchmark:
        bench_path("data/tokenizer"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/make_tokenizer.py"


rule corpus:
    """Seeded token-budget subset and stream of the pretraining corpus, with a manifest."""
    input:
        tokenizer=data_path("tokenizer"),
        code_train=data_path("code", "train.jsonl"),
        math_train=data_path("math", "train.jsonl"),
    output:
        **corpus_outputs(),
    params:
        data={k: config["data"][k] for k in ("seed", "corpus")},
    log:
        log_path("data/corpus"),
    benchmark:
        bench_path("data/corpus"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/make_corpus.py"


rule prompt_set:
    """Distillation prompts from a data set (paper: OPDLM's rollouts)."""
    output:
        data_path("prompts", "{pset}.jsonl"),
    params:
        spec=lambda wc: config["data"]["prompt_sets"][wc.pset],
        seed=config["data"]["seed"],
    log:
        log_path("data/prompts_{pset}"),
    benchmark:
        bench_path("data/prompts_{pset}"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/make_prompt_set.py"


rule code_benchmark:
    """A code benchmark's problems in one file: the held-out suite, the real HumanEval file, an
    evalplus release (fetched here, once) or a local file; cut to the benchmark's limit."""
    input:
        lambda wc: [data_path("code", "eval.jsonl")] if config["eval"]["benchmarks"][wc.benchmark].get("source") == "suite" else [],
    output:
        data_path("benchmarks", "{benchmark}.jsonl"),
    params:
        spec=lambda wc: config["eval"]["benchmarks"][wc.benchmark],
    log:
        log_path("data/benchmark_{benchmark}"),
    benchmark:
        bench_path("data/benchmark_{benchmark}"),
    conda:
        "../envs/ar2dlm.yaml"
    script:
        "../workflow_scripts/code_benchmark.py"
