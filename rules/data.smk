# Data stage: synthetic suites, preference pairs, tokenizer, pretraining corpus (subset + stream).


rule synthetic_suites:
    """HumanEval+-format code suite and arithmetic suite: train, held-out eval, and validation (what
    sweeps choose settings on)."""
    output:
        code_train=layout.suite_file("code", "train"),
        code_eval=layout.suite_file("code", "eval"),
        code_valid=layout.suite_file("code", "valid"),
        math_train=layout.suite_file("math", "train"),
        math_eval=layout.suite_file("math", "eval"),
        math_valid=layout.suite_file("math", "valid"),
    log:
        layout.log_path("data/synthetic_suites"),
    benchmark:
        layout.bench_path("data/synthetic_suites")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        data={k: config["data"][k] for k in ("seed", "code_suite", "math_suite")},
    script:
        "../workflow_scripts/make_suites.py"


rule preferences:
    """Preference pairs (prompt, chosen, rejected) of one domain, train and held-out."""
    input:
        unpack(preference_inputs),
        hub_ready(lambda wc: f"data.preferences.domains.{wc.domain}"),
    output:
        train=layout.preference_file("{domain}", "train"),
        eval=layout.preference_file("{domain}", "eval"),
    log:
        layout.log_path("data/preferences_{domain}"),
    benchmark:
        layout.bench_path("data/preferences_{domain}")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        data={k: config["data"][k] for k in ("seed", "preferences")},
    script:
        "../workflow_scripts/make_preferences.py"


rule tokenizer:
    """Byte-level BPE trained on the corpus text, or the pretrained tokenizer plus a mask token."""
    input:
        hub_ready("data.tokenizer"),
        code_train=layout.suite_file("code", "train"),
        math_train=layout.suite_file("math", "train"),
    output:
        directory(layout.tokenizer_dir()),
    log:
        layout.log_path("data/tokenizer"),
    benchmark:
        layout.bench_path("data/tokenizer")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        data={
            "seed": config["data"]["seed"],
            "tokenizer": config["data"]["tokenizer"],
            "corpus": {"stdlib_files": config["data"]["corpus"]["stdlib_files"]},
        },
    script:
        "../workflow_scripts/make_tokenizer.py"


rule corpus:
    """Seeded token-budget subset and stream of the pretraining corpus, with a manifest."""
    input:
        hub_ready("data.corpus"),
        tokenizer=layout.tokenizer_dir(),
        code_train=layout.suite_file("code", "train"),
        math_train=layout.suite_file("math", "train"),
    output:
        **corpus_outputs(),
    log:
        layout.log_path("data/corpus"),
    benchmark:
        layout.bench_path("data/corpus")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        data={k: config["data"][k] for k in ("seed", "corpus")},
    script:
        "../workflow_scripts/make_corpus.py"


rule prompt_set:
    """Distillation prompts from a data set (paper: OPDLM's rollouts)."""
    input:
        hub_ready(lambda wc: f"data.prompt_sets.{wc.pset}"),
    output:
        layout.prompt_set_file(),
    log:
        layout.log_path("data/prompts_{pset}"),
    benchmark:
        layout.bench_path("data/prompts_{pset}")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        spec=lambda wc: config["data"]["prompt_sets"][wc.pset],
        seed=config["data"]["seed"],
    script:
        "../workflow_scripts/make_prompt_set.py"


rule token_rows_shard:
    """One of the parallel jobs of a large token_rows (as many as the planner gives it): every n-th
    chunk of the source's documents tokenised, resumably (a killed job's rerun continues from its
    last written part, kept in <output>.partial, which is not an output and so survives a failure)."""
    input:
        hub_ready(lambda wc: "data.corpus" if wc.source == "stream" else None),  # a stream not written out
        source=lambda wc: token_rows_source(config["data"], wc.source),
        tokenizer=layout.tokenizer_dir(),
    output:
        temp(directory(layout.token_rows_shard_dir())),
    log:
        layout.log_path("data/token_rows_{source}_{selection}_len{seq_len}_shard{shard}of{shards}"),
    benchmark:
        layout.bench_path("data/token_rows_{source}_{selection}_len{seq_len}_shard{shard}of{shards}")
    priority: 50
    conda:
        "../envs/ar2dlm.yaml"
    threads: token_rows_threads
    resources:
        **token_rows_resources(),
    script:
        "../workflow_scripts/make_token_rows.py"


rule token_rows:
    """A corpus cut, prompt set or stream tokenised once into memory-mapped rows of one sequence
    length, the documents a run's objective trains on (every conversion reads its rows from here):
    packed rows of a corpus cut, one document per row otherwise. A source the planner splits is
    merged from its shards; a small one is tokenised here (resumably too)."""
    input:
        hub_ready(lambda wc: "data.corpus" if wc.source == "stream" else None),  # a stream not written out
        source=lambda wc: token_rows_source(config["data"], wc.source),
        tokenizer=layout.tokenizer_dir(),
        shards=token_rows_shards,
    output:
        directory(layout.token_rows_dir()),
    log:
        layout.log_path("data/token_rows_{source}_{selection}_len{seq_len}"),
    benchmark:
        layout.bench_path("data/token_rows_{source}_{selection}_len{seq_len}")
    # every conversion waits on these rows: scheduled before any ready single-core job, since a
    # multi-core job left waiting for free cores would otherwise idle the cores it does not hold
    priority: 50
    conda:
        "../envs/ar2dlm.yaml"
    threads: token_rows_threads
    resources:
        **token_rows_resources(),
    script:
        "../workflow_scripts/make_token_rows.py"


rule prefetch:
    """Every hub asset the config needs into the local Hugging Face cache (models, tokenizer,
    corpus, preferences, prompt sets, lm-eval and mteb data sets), and the evalplus release files.
    A local rule, for where the network is; every other job reads the cache with the hub offline."""
    input:
        lambda wc: [
            layout.benchmark_problems(b)
            for b, spec in config["eval"]["benchmarks"].items()
            if spec.get("source") == "evalplus"
        ],
        hub_ready_to_fetch,
    log:
        layout.log_path("data/prefetch"),
    conda:
        "../envs/ar2dlm.yaml"
    params:
        assets=[dataclasses.asdict(a) for a in HUB_ASSETS],
    script:
        "../workflow_scripts/prefetch.py"


rule code_benchmark:
    """A code benchmark's problems in one file: the held-out suite, the real HumanEval file, an
    evalplus release (fetched here, once) or a local file; cut to the benchmark's limit."""
    input:
        lambda wc: (
            [layout.suite_file("code", "eval")]
            if config["eval"]["benchmarks"][wc.benchmark].get("source") == "suite"
            else []
        ),
    output:
        layout.benchmark_problems(),
    log:
        layout.log_path("data/benchmark_{benchmark}"),
    benchmark:
        layout.bench_path("data/benchmark_{benchmark}")
    conda:
        "../envs/ar2dlm.yaml"
    params:
        spec=lambda wc: config["eval"]["benchmarks"][wc.benchmark],
    script:
        "../workflow_scripts/code_benchmark.py"
