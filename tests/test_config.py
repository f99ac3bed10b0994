"""The DAG builds for every preset; bad configs fail at DAG build time naming the key."""

import json
import re

import pytest
import yaml

from tests.conftest import REPO, planned_files, planned_rules


@pytest.mark.parametrize("preset", ["smoke", "tiny", "paper", None])
def test_dry_run_all_tables(preset_dry_run, preset):
    """Every preset's DAG builds, and the build imports neither torch nor transformers (a job imports them):
    every Snakemake start (a dry run, each SLURM job) reads the Snakefile."""
    proc = preset_dry_run(preset)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rules = planned_rules(proc.stdout)
    assert {"synthetic_suites", "tokenizer", "corpus", "teacher", "eval_teacher_code", "run_summary"} <= rules, rules
    assert "snakemake.workflow" in proc.imported and "ar2dlm.pipeline.checks" in proc.imported  # the list is whole
    assert not {m.split(".")[0] for m in proc.imported} & {"torch", "transformers", "trl", "peft", "datasets"}


def test_paper_dry_run_lists_every_model(preset_dry_run):
    proc = preset_dry_run("paper")
    assert proc.returncode == 0, proc.stderr
    files = planned_files(proc.stdout)
    for model in ("qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b"):
        assert f"results/models/{model}/teacher" in files, sorted(files)[:20]
        assert f"results/eval/teacher_check/{model}.json" in files
        assert f"results/eval/humaneval_plus/{model}/teacher.json" in files
    assert "results/data/preferences/helpful/train.jsonl" in files
    assert "results/data/prompts/general.jsonl" in files  # OPDLM's rollout prompts
    for job in (
        "qwen3_0_6b/ra/seed0",
        "qwen3_4b/ra/seed0",
        "qwen3_8b/opd/seed0",
        "qwen3_8b/ed/seed0",
        "qwen3_4b/ed_long/seed0",
        "qwen3_0_6b/ra_freeze/seed0",
    ):
        assert f"results/models/{job}/train.json" in files
    for ev in (
        "humaneval_plus/qwen3_0_6b/ra/seed0/step_200000",
        "mbpp_plus/qwen3_1_7b/mdlm/seed0/step_200000",
        "humaneval_plus/qwen3_4b/scratch/seed0/step_10000",  # adaptation: every checkpoint
        "aime24/qwen3_8b/opd/seed0/step_1000",
        "gpqa_diamond/qwen3_4b/ed_bidir/seed0/step_19000",
        "mteb/qwen3_4b/ed/seed0/step_19000",  # Efficient-DLM's own block model
        "code_throughput/qwen3_8b/opd/seed0/step_1000",
    ):
        assert f"results/eval/{ev}.json" in files
    assert "results/data/benchmarks/mbpp_plus.jsonl" in files
    for out in (
        "models/qwen3_8b/teacher_dpo/helpful/seed0",
        "models/qwen3_8b/teacher_dpo/all/seed0",
        "armap/qwen3_8b/ed/seed0/helpful/ties/gamma.json",
        "armap/qwen3_4b/ed/seed0/math/spectra.csv",
        "models/qwen3_8b/ed/seed0/dlm_dpo/math",
        "eval/gsm8k/qwen3_8b/ed/seed0/armap_math_dare.json",  # AR-MAP's three domains, each on its benchmark
        "eval/truthfulqa_mc2/qwen3_8b/ed/seed0/armap_truthful_task_arithmetic.json",
        "eval/helpfulness/qwen3_8b/ed/seed0/dlm_dpo_helpful.json",
        "data/preferences/truthful/eval.jsonl",
    ):
        assert f"results/{out}" in files, out


def test_paper_dry_run_through_the_slurm_profile(tmp_path, standin_hub):
    from tests.conftest import run_snakemake

    proc = run_snakemake(
        [
            "--profile",
            str(REPO / "slurm"),
            "-n",
            "all_tables",
            "bench",
            "--configfile",
            str(REPO / "config" / "presets" / "paper.yaml"),
        ],
        tmp_path,
        timeout=120,
        hub_cache=standin_hub,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    blocks = out.split("\n\n")
    convert = next(b for b in blocks if "rule convert:" in b and "qwen3_8b/opd/" in b)
    assert (
        "gpu=8" in convert and "cpus_per_gpu=8" in convert and "runtime=4320" in convert and "mem_mb=480000" in convert
    )
    assert "--nproc_per_node=8" in convert
    # a 2-node job: one torchrun per node through srun, meeting by c10d rendezvous
    two_nodes = next(b for b in blocks if "rule convert:" in b and "qwen3_8b/ed/" in b)
    assert "nodes=2" in two_nodes and "gpu=16" in two_nodes and "mpi=srun" in two_nodes
    # the step's task on each node holds that node's 8 GPUs and their CPUs, said explicitly
    assert (
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --gpus-per-task=8 --gpu-bind=none --cpus-per-task=64"
        in two_nodes
    )
    # every planned conversion stops with a checkpoint before its job's limit, for its retry to resume
    from ar2dlm.plan.armap import STOP_FRACTION

    stop = (
        STOP_FRACTION
        * yaml.safe_load((REPO / "config" / "presets" / "paper.yaml").read_text())["cluster"]["runtime_hours"]
    )
    assert all(f'"stop_after_hours": {stop:g}' in b for b in blocks if "rule convert:" in b)
    assert "--nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d" in two_nodes
    # without --use-conda the job's processes run the interpreter of the job's own Snakemake (a SLURM job
    # starts the submitting environment's); under it, the activated environment's python
    import sys

    assert f"exec {sys.executable} -m ar2dlm.training.torchrun" in two_nodes
    # the environment --use-conda builds holds the package's dependencies, no more, no fewer
    import tomllib

    env = yaml.safe_load((REPO / "envs" / "ar2dlm.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all(
        '"../envs/ar2dlm.yaml"' in f.read_text() for f in (REPO / "rules").glob("*.smk") if f.name != "common.smk"
    )
    evaluation = next(b for b in blocks if "rule evaluate_checkpoint:" in b)
    assert "gpu=1" in evaluation
    # the training benchmark times the 8B runs on the GPUs their plan gives, sharded as planned
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve
    from ar2dlm.plan.memory import plan_bench_train

    bench = plan_bench_train(resolve(merge_preset({"preset": "paper"}, REPO / "config")))
    bench_train = next(b for b in blocks if "rule bench_train:" in b)
    assert bench.launch.gpus >= 8 and f"gpu={bench.launch.gpus}" in bench_train, bench_train
    assert f"--nproc_per_node={bench.launch.gpus_per_node}" in bench_train and '"gpus": ' in bench_train
    # every job holding a GPU goes to the GPU partition, the CPU-only ones (data, tokenisation) to the CPU one;
    # the profile's disk_mb spares Snakemake its own estimate (whose coroutine it never awaited)
    import re

    jobs = [b for b in blocks if re.search(r"^rule \w+:", b, re.M) and "resources:" in b]
    gpu_jobs = [b for b in jobs if re.search(r"\bgpu=[1-9]", b)]
    cpu_jobs = [b for b in jobs if b not in gpu_jobs]
    assert gpu_jobs and all("slurm_partition=gpu" in b for b in gpu_jobs)
    assert {"rule corpus:", "rule token_rows_shard:"} <= {re.search(r"rule \w+:", b).group(0) for b in cpu_jobs}
    assert all("slurm_partition=cpu" in b for b in cpu_jobs)
    assert "never awaited" not in proc.stderr
    # the 50B-token stream: tokenised by the planner's shard jobs, each with its memory and runtime, then merged
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.plan.tokenize import plan_tokenize

    stream = plan_tokenize(merge_preset({"preset": "paper"}, REPO / "config"), "stream", "documents", 2048)
    shards = [b for b in blocks if "rule token_rows_shard:" in b]
    assert len(shards) == stream.shards > 1
    assert all(f"mem_mb={stream.mem_mb}," in b and f"runtime={stream.runtime_minutes}" in b for b in shards)
    merge = next(b for b in blocks if "rule token_rows:" in b and "token_rows/stream/" in b)
    assert all(f"documents_len2048.shards/{k}-of-{stream.shards}" in merge for k in range(stream.shards))
    # table, figure and report rules run where Snakemake runs, never as cluster jobs
    snakefile = (REPO / "Snakefile").read_text()
    local = set(re.search(r"localrules:([^\n]*(?:\n {4}[^\n]*)*)", snakefile).group(1).replace(",", " ").split())
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    assert {"study_table", "study_figure", "claims", "armap_report", "eval_summary", "run_summary"} <= local
    assert not local & set(profile["set-resources"])
    for rule in ("teacher", "evaluate_checkpoint", "gamma_search"):
        assert profile["set-resources"][rule]["gpu"] >= 1 and profile["set-resources"][rule]["cpus_per_gpu"] >= 1
    for rule in ("dpo_teacher", "dlm_preference"):  # GPUs from the planner: LoRA DPO on one, in the paper preset
        block = next(b for b in blocks if f"rule {rule}:" in b)
        assert "gpu=1" in block and "mem_mb=64000" in block and "cpus_per_gpu=8" in block, block
    # AR-MAP's runtimes are the ones the planner times its jobs against, not the profile's
    paper = yaml.safe_load((REPO / "config" / "presets" / "paper.yaml").read_text())
    runtimes = paper["cluster"]["armap_runtime_hours"]
    for kind, hours in runtimes.items():
        rule = {"dlm_dpo": "dlm_preference"}.get(kind, kind)  # the direct baselines' rule, objective dpo
        block = next(b for b in blocks if f"rule {rule}:" in b)
        assert f"runtime={round(hours * 60)}" in block and "runtime" not in profile["set-resources"][rule], block


def test_use_conda_runs_every_job_in_the_environment_file(tmp_path, standin_hub):
    """Under ``--use-conda`` every job names ``envs/ar2dlm.yaml`` and starts the activated environment's
    ``python``, not the submitting interpreter. Conda cannot build an environment here (no channel is
    reachable), so a stand-in ``conda`` answers the three queries Snakemake makes before it would build
    one, and the DAG is dry-run."""
    import os
    import sys
    from pathlib import Path

    from tests.conftest import run_snakemake

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    conda = bin_dir / "conda"
    info = {"conda_prefix": "/opt/conda", "envs_dirs": ["/opt/conda/envs"], "platform": "linux-64"}
    answers = {"--version": "conda 24.11.0", "info": info, "config": {"get": {"channel_priority": "strict"}}}
    cases = "".join(f"  {k}) echo '{v if isinstance(v, str) else json.dumps(v)}';;\n" for k, v in answers.items())
    conda.write_text(f'#!/bin/sh\ncase "$1" in\n{cases}  *) exit 1;;\nesac\n')
    conda.chmod(0o755)
    args = ["-n", "-p", "--use-conda", "all_tables", "--configfile", str(REPO / "config" / "presets" / "smoke.yaml")]
    proc = run_snakemake(
        args, tmp_path, timeout=120, hub_cache=standin_hub, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    created = re.findall(r"^Conda environment (\S+) will be created\.$", out, re.M)
    assert [Path(p).resolve() for p in created] == [REPO / "envs" / "ar2dlm.yaml"], created
    commands = re.findall(r"^Shell command: (.*)$", out, re.M)
    converts = [c for c in commands if "ar2dlm.training.convert_run" in c]
    assert converts and all(c.startswith("python -m ar2dlm.training.convert_run") for c in converts), converts[:2]
    assert not any(sys.executable in c for c in commands)


def test_one_figure_builds_only_what_it_needs(dry_run):
    proc = dry_run(target="results/ablations/lambda.pdf")
    assert proc.returncode == 0, proc.stderr
    rules, files = planned_rules(proc.stdout), planned_files(proc.stdout)
    assert "study_figure" in rules and "results/ablations/lambda.pdf" in files
    trained = {m.group(1) for f in files if (m := re.fullmatch(r"results/models/tiny/(\w+)/seed0/train.json", f))}
    assert trained == {"mdlm", "ra_l1", "ra", "ra_l100"}, trained
    assert not rules & {"dpo_teacher", "gamma_search", "claims", "study_table", "preferences"}, rules


def test_embedded_default_is_the_tiny_preset():
    import yaml

    from ar2dlm.pipeline.config import merge_preset

    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    tiny = yaml.safe_load((REPO / "config" / "presets" / "tiny.yaml").read_text())
    assert default == {"preset": "tiny"} and merge_preset(default, REPO / "config") == tiny


def test_override_merges_over_preset():
    from ar2dlm.pipeline.config import merge_preset

    cfg = merge_preset({"preset": "smoke", "models": {"tiny": {"pretrain": {"steps": 7}}}}, REPO / "config")
    assert cfg["models"]["tiny"]["pretrain"]["steps"] == 7
    assert cfg["models"]["tiny"]["pretrain"]["batch_size"] == 8  # untouched keys keep the preset's value


EFFECT = {"effect": {"value": 0.05, "where": "test"}}  # what every claim names


BAD_CONFIGS = [
    ({"training": {"lr": float("nan")}}, "training.lr", "nan is not a finite number"),
    ({"armap": {"gamma": {"grid": [0, 1, float("inf")]}}}, "armap.gamma.grid.2", "inf is not a finite number"),
    # (override merged over the smoke preset, key that the error must name, words it must contain)
    ({"data": {"corpus": {"subset_tokenz": 5}}}, "data.corpus", "subset_tokenz"),
    ({"modelz": {}}, "<top level>", "modelz"),
    ({"data": {"code_suite": {"n_train": "many"}}}, "data.code_suite.n_train", "is not of type 'integer'"),
    ({"data": {"corpus": {"stream_tokens": 0}}}, "data.corpus.stream_tokens", "minimum"),
    ({"models": {"tiny": {"pretrain": {"steps": -5}}}}, "models.tiny.pretrain.steps", "minimum"),
    ({"data": {"corpus": {"subset_tokens": 30000}}}, "data.corpus.subset_tokens", "larger than its source"),
    ({"data": {"preferences": {"n_eval": 100}}}, "data.preferences.n_eval", "larger than their source"),
    ({"eval": {"teacher_code": {"limit": 1000}}}, "eval.teacher_code.limit", "larger than their source"),
    (
        {"data": {"code_suite": {"heldout_fraction": 0}}},
        "data.code_suite.heldout_fraction",
        "less than or equal to the minimum of 0",
    ),
    ({"data": {"code_suite": {"n_eval": 0}}}, "data.code_suite.n_eval", "minimum"),
    ({"data": {"code_suite": {"heldout_fraction": 0.99}}}, "data.code_suite.heldout_fraction", "no training pairing"),
    ({"preset": "huge"}, "preset", "unknown preset"),
    ({"models": {"tiny": {"arch": {"num_attention_heads": 3}}}}, "models.tiny.arch.num_attention_heads", "must divide"),
    ({"models": {"tiny": {"pretrain": {"dtype": "fp8"}}}}, "models.tiny.pretrain.dtype", "fp8"),
    (
        {
            "models": {
                "big": {
                    "source": "hub",
                    "hub_id": "Qwen/Qwen3-0.6B-Base",
                    "model_path": "/nonexistent/qwen",
                    "revision": None,
                }
            }
        },
        "models.big.model_path",
        "missing checkpoint",
    ),
    ({"models": {"big": {"source": "hub"}}}, "models.big", "hub_id"),
    (
        {"data": {"preferences": {"domains": {"poetry": {"source": "synthetic"}}}}},
        "data.preferences.domains.poetry",
        "no synthetic preference domain",
    ),
    ({"runs": {"ed": {"method": "diffusion_magic"}}}, "runs.ed.method", "diffusion_magic"),
    (
        {"runs": {"ed": {"block_size": 12}}},
        "runs.ed.block_size",
        "block size 12 does not divide the sequence length 32",
    ),
    ({"runs": {"ra": {"align": {"layers": [0, 7]}}}}, "runs.ra.align.layers", "layer 7 does not exist"),
    ({"runs": {"ra": {"align": {"metric": "kl"}}}}, "runs.ra.align.metric", "kl"),
    ({"runs": {"ra": {"freeze": ["embeddings", "brain"]}}}, "runs.ra.freeze.1", "brain"),
    ({"runs": {"ra": {"models": ["qwen9"]}}}, "runs.ra.models", "qwen9"),
    (
        {"runs": {"opd_curriculum": {"distill": {"curriculum": {"min_length": 16, "max_length": 8}}}}},
        "runs.opd_curriculum.distill.curriculum.min_length",
        "exceeds max_length",
    ),
    ({"runs": {"opd": {"distill": {"rollout_length": 6}}}}, "runs.opd.distill", "block size 4 does not divide"),
    ({"runs": {"opd": {"distill": {"on_policy": "off"}}}}, "runs.opd.distill.on_policy", "is not of type 'boolean'"),
    ({"studies": {"ablations/lambda": {"runs": ["ra", "ra_l1000"]}}}, "studies.ablations/lambda.runs", "ra_l1000"),
    ({"training": {"steps": 0}}, "training.steps", "minimum"),
    ({"runs": {"teacher": {"method": "mdlm"}}}, "runs.teacher", "names the AR teacher"),
    ({"runs": {"opd": {"distill": {"prompts": "poems"}}}}, "runs.opd.distill.prompts", "neither all, code, math"),
    (
        {"data": {"prompt_sets": {"math": {"path": "json", "split": "train", "prompt_field": "q", "n": 5}}}},
        "data.prompt_sets",
        "should not be valid under",
    ),
    (
        {
            "data": {"prompt_sets": {"qs": {"path": "json", "split": "train", "prompt_field": "q", "n": 5}}},
            "runs": {"opd_off": {"distill": {"prompts": "qs"}}},
        },
        "runs.opd_off.distill.on_policy",
        "no completion_field",
    ),
    ({"bench": {"benchmark": "arithmetic"}}, "bench.benchmark", "not a code benchmark"),
    ({"bench": {"task_prompts": 5}}, "bench.task_prompts", "5 prompts, but benchmark synthetic_code keeps 4"),
    (
        {"bench": {"max_new_tokens": 100}},
        "bench.max_new_tokens",
        "block size 8 does not divide the generation length 100",
    ),
    (
        {"models": {"tiny": {"pretrain": {"warmup_steps": 10**6}}}},
        "models.tiny.pretrain.warmup_steps",
        "1000000 warm-up steps, not fewer than the run's",
    ),
    ({"studies": {"combined": {"evals": ["vibes"]}}}, "studies.combined.evals", "'vibes' is not a key of eval"),
    (
        {"eval": {"benchmarks": {"synthetic_code": {"max_new_tokens": 12}}}},
        "eval.benchmarks.synthetic_code.max_new_tokens",
        "does not divide the generation length 12",
    ),
    (
        {"eval": {"decoding": {"steps_per_block": 9}}},
        "eval.benchmarks.synthetic_code.steps_per_block",
        "9 steps exceed the block size 8",
    ),
    (
        {"eval": {"benchmarks": {"arithmetic": {"limit": 17}}}},
        "eval.benchmarks.arithmetic.limit",
        "larger than their source",
    ),
    (
        {"eval": {"benchmarks": {"synthetic_code_sampled": {"temperature": 0}}}},
        "eval.benchmarks.synthetic_code_sampled.temperature",
        "need a temperature above 0",
    ),
    ({"armap": {"domains": ["poetry"]}}, "armap.domains", "'poetry' is not a key of data.preferences.domains"),
    ({"armap": {"merges": {"ties": {"density": 1.5}}}}, "armap.merges.ties.density", "maximum"),
    ({"armap": {"merge_seeds": {"ties": [0, 4]}}}, "armap.merge_seeds.ties", "[4] not in armap.seeds"),
    ({"armap": {"merge_seeds": {"task_arithmetic": [0]}}}, "armap.merge_seeds.task_arithmetic", "every seed"),
    ({"armap": {"dlm_dpo_seeds": [0, 4]}}, "armap.dlm_dpo_seeds", "[4] not in armap.seeds"),
    (
        {"studies": {"repr_align/code": {"run_seeds": {"ra_l1": [0]}}}},
        "studies.repr_align/code.run_seeds",
        "'ra_l1' is not one of the study's runs",
    ),
    ({"tracking": {"backend": "comet"}}, "tracking.backend", "is not one of"),
    (
        {"eval": {"benchmarks": {"arith_choice": {"local": False, "task": "arith_choise"}}}},
        "eval.benchmarks.arith_choice.task",
        "'arith_choise' is not a task of the installed lm-eval",
    ),
    (
        {"eval": {"benchmarks": {"retrieval": {"tasks": ["docstring_retrieval", "SciFacts"]}}}},
        "eval.benchmarks.retrieval.tasks",
        "'SciFacts' not a task of the installed mteb",
    ),
    ({"armap": {"dpo": {"grad_accum": 3}}}, "armap.dpo.grad_accum", "3 micro-batches do not divide batch_size 4"),
    ({"studies": {"repr_align/code": {"seeds": [0, 0]}}}, "studies.repr_align/code.seeds", "non-unique elements"),
    (
        {"studies": {"repr_align/code": {"runs": ["ra", "mdlm", "ra"]}}},
        "studies.repr_align/code.runs",
        "non-unique elements",
    ),
    ({"armap": {"gamma": {"grid": [0, 1, 1, 2]}}}, "armap.gamma.grid", "non-unique elements"),
    (
        {"runs": {"ed": {"training": {"grad_accum": 3}}}},
        "runs.ed.training.grad_accum",
        "run ed: 3 micro-batches do not divide batch_size 4",
    ),
    ({"training": {"grad_accum": 3}}, "training.grad_accum", "3 micro-batches do not divide batch_size 4"),
    (
        {"runs": {"ed": {"training": {"warmup_steps": 100, "steps": 100}}}},
        "runs.ed.training.warmup_steps",
        "100 warm-up steps, not fewer than the run's 100 steps",
    ),
    (
        {
            "eval": {
                "benchmarks": {
                    "mine": {
                        "kind": "code",
                        "source": "path",
                        "format": "evalplus",
                        "dataset": "humaneval",
                        "style": "body",
                        "max_new_tokens": 16,
                        "parallel": 1,
                        "limit": None,
                        "n_samples": 1,
                        "temperature": 0,
                    }
                }
            }
        },
        "eval.benchmarks.mine",
        "'path' is a required",
    ),
    # claims (claims.judged): each names its study's runs, one of its benchmarks and a metric that benchmark writes
    (
        {"claims": {"judged": {"align_beats_no_align": {"run": "rb"}}}},
        "claims.judged.align_beats_no_align.run",
        "'rb' is not one of the runs of studies.repr_align/code",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"against": "ra_l1"}}}},
        "claims.judged.cosine_beats_l2.against",
        "'ra_l1' is neither teacher, best_other nor one of the runs of studies.repr_align/metric",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"study": "repr_align/metrics"}}}},
        "claims.judged.cosine_beats_l2.study",
        "'repr_align/metrics' is not a key of studies",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"benchmark": "arithmetic"}}}},
        "claims.judged.cosine_beats_l2.benchmark",
        "'arithmetic' is not one of the evals of studies.repr_align/metric",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"metric": "pass@1"}}}},
        "claims.judged.cosine_beats_l2.metric",
        "'pass@1' is not a metric of benchmark synthetic_code",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"metric": "base_pass@10"}}}},
        "claims.judged.cosine_beats_l2.metric",
        "base_pass@10 needs at least 10 samples per task; eval.benchmarks.synthetic_code.n_samples is 1",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"direction": "better"}}}},
        "claims.judged.cosine_beats_l2.direction",
        "'better' is not one of",
    ),
    (
        {"claims": {"judged": {"cosine_beats_l2": {"decoding": "lowest_threshold"}}}},
        "claims.judged.cosine_beats_l2.decoding",
        "not one row per decoding setting",
    ),
    (
        {
            "claims": {
                "judged": {"new": {"paper": "X", "text": "t", "direction": "greater", "study": "combined", **EFFECT}}
            }
        },
        "claims.judged.new",
        "'run' is a required property",
    ),
    (
        {"claims": {"judged": {"new": {"paper": "X", "text": "t", "direction": "greater", "study": "combined"}}}},
        "claims.judged.new",
        "'effect' is a required property",
    ),
    (
        {"claims": {"judged": {"armap_gamma_above_one": {"armap": {"merge": "slerp"}}}}},
        "claims.judged.armap_gamma_above_one.armap.merge",
        "'slerp' is not a key of armap.merges",
    ),
    (
        {"claims": {"judged": {"armap_gamma_above_one": {"armap": {"measure": "gamma_order"}}}}},
        "claims.judged.armap_gamma_above_one.armap",
        "'lower' is a required property",
    ),
    (
        {
            "claims": {
                "judged": {
                    "new": {
                        "paper": "AR-MAP",
                        "text": "t",
                        "direction": "greater",
                        "armap": {"measure": "above_one", "merge": "task_arithmetic"},
                        **EFFECT,
                    }
                }
            }
        },
        "claims.judged.new",
        "'quote' is a required property",
    ),
]


@pytest.mark.parametrize("override,key,words", BAD_CONFIGS, ids=[b[1] + ":" + b[2][:20] for b in BAD_CONFIGS])
def test_bad_config_fails_naming_the_key(override, key, words):
    """The check the Snakefile builds its DAG from, in this process (a snakemake start per case would cost
    5 s each; the two cases below go through snakemake)."""
    from ar2dlm.pipeline.checks import checked_config
    from ar2dlm.pipeline.config import ConfigError
    from ar2dlm.provenance import deep_merge

    smoke = yaml.safe_load((REPO / "config" / "presets" / "smoke.yaml").read_text())
    with pytest.raises(ConfigError) as err:
        checked_config(deep_merge(smoke, override), REPO / "config")
    assert err.value.key == key and words in str(err.value), str(err.value)


@pytest.mark.parametrize("case", ["schema", "cross-key"])
def test_a_bad_config_fails_the_dag_build_before_any_job(dry_run, case):
    named = {"schema": "data.code_suite.n_train", "cross-key": "data.corpus.subset_tokens"}[case]
    override, key, words = next(b for b in BAD_CONFIGS if b[1] == named)
    proc = dry_run(override)
    out = proc.stderr + proc.stdout
    assert proc.returncode != 0, out
    assert f"invalid config: config key '{key}'" in out and words in out, out[-2000:]
    assert "rule " not in proc.stdout  # failed before any job was planned


def test_micro_batches_that_split_over_no_planned_launch_fail_at_dag_build(dry_run):
    proc = dry_run({"runs": {"ra": {"training": {"batch_size": 12, "grad_accum": 1}}}}, preset="paper")
    out = proc.stderr + proc.stdout
    assert proc.returncode != 0 and "config key 'runs.ra.training.grad_accum'" in out, out[-2000:]
    assert "micro-batches of 12 rows" in out and "8, 16, 24" in out and "rule " not in proc.stdout


def test_a_tracker_whose_package_is_missing_is_named_at_dag_build(dry_run):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    proc = dry_run({"tracking": {"backend": "wandb", "project": "p"}})
    out = proc.stderr + proc.stdout
    assert proc.returncode != 0 and "config key 'tracking.backend'" in out and "pip install wandb" in out, out[-2000:]


def test_lint_is_clean():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_runs_compose_method_defaults_with_their_own_keys():
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    cfg = merge_preset({"preset": "tiny"}, REPO / "config")
    ra = resolve(cfg).run("ra")
    assert ra["align"] == {"lambda": 10.0, "metric": "cos", "layers": "all"} and ra["attention"] == "bidirectional"
    assert ra["shift"] is True and ra["distill"] is None and ra["training"] == cfg["training"]
    full = merge_preset({"preset": "tiny_full"}, REPO / "config")
    runs = resolve(full).runs
    combo = runs["combined"]  # distillation plus alignment on a block student, by config only
    assert combo["attention"] == "block" and combo["block_size"] == 4 and combo["init"] == "ar"
    assert combo["align"]["lambda"] == 1 and combo["align"]["metric"] == "cos"
    assert combo["distill"]["on_policy"] is True and combo["distill"]["rollout_length"] == 32
    assert combo.steps == runs["opd"].steps
    long = runs["ed_long"]  # a run's own training keys over the preset's, the others kept
    assert long["training"]["steps"] == 1900 and long["training"]["checkpoint_every"] == 380
    assert long["training"]["batch_size"] == full["training"]["batch_size"]
    assert long["masking"] == "positional" and long["block_size"] == 8 and long["data"] == "stream"


def test_smoke_covers_the_tiny_and_tiny_full_grid():
    """tiny_full extends tiny (every tiny run and study, settings kept but for the longer budgets
    tiny_full trains them to); smoke extends tiny_full, so CI's smoke run passes through every run
    and study of both."""
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve

    tiny = merge_preset({"preset": "tiny"}, REPO / "config")
    full = merge_preset({"preset": "tiny_full"}, REPO / "config")
    smoke = merge_preset({"preset": "smoke"}, REPO / "config")
    assert set(tiny["runs"]) < set(full["runs"]) and set(tiny["studies"]) < set(full["studies"])
    tiny_runs, full_runs = resolve(tiny).runs, resolve(full).runs
    for r in tiny["runs"]:
        budget = ("steps", "checkpoint_every")
        small, large = tiny_runs[r].as_dict(), full_runs[r].as_dict()
        assert large["training"]["steps"] >= small["training"]["steps"], r
        for run in (small, large):
            run["training"] = {k: v for k, v in run["training"].items() if k not in budget}
        assert large == small, r
    assert full["models"] == tiny["models"] and full["data"] == tiny["data"]  # the same teacher and data
    assert set(smoke["runs"]) == set(full["runs"]) and set(smoke["studies"]) == set(full["studies"])
    assert smoke["training"]["steps"] < tiny["training"]["steps"] and "extends" not in smoke
    # a run with its own step budget in tiny or tiny_full must not keep it in smoke
    assert all(run.steps <= 2 * smoke["training"]["steps"] for run in resolve(smoke).runs.values())


def test_run_seeds_merge_seeds_and_dlm_dpo_seeds_narrow_the_jobs():
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve
    from ar2dlm.reporting.armap import armap_report_inputs
    from ar2dlm.reporting.claims import claim_inputs

    cfg = merge_preset({"preset": "tiny_full"}, REPO / "config")
    resolved = resolve(cfg)
    spec, study = cfg["studies"]["repr_align/code"], resolved.studies["repr_align/code"]
    assert len(spec["seeds"]) > 1  # the study's seeds; scratch is narrowed to its run's own
    assert study.seeds("scratch") == [0] and study.seeds("ra") == spec["seeds"]
    assert {c.seed for c in resolved.conversions if c.run == "scratch"} == {0}
    greedy = {(e.run, e.seed) for e in resolved.evals[0] if e.benchmark == "synthetic_code"}
    assert ("scratch", 1) not in greedy and ("scratch", 0) in greedy and ("mdlm", 5) in greedy
    assert not any("/scratch/seed1/" in p for p in claim_inputs(resolved))  # claims pair ra and mdlm on their seeds
    # tiny_full's claims read TIES and DARE on every seed; a merge no claim reads may be searched on fewer
    assert {j.seed for j in resolved.armap.search if j.merge == "ties"} == set(range(6))
    for merge in ("ties", "dare"):
        del cfg["claims"]["judged"][f"armap_{merge}_transfers"]
    cfg["armap"]["merge_seeds"] = {"ties": [0], "dare": [0]}
    resolved = resolve(cfg)
    jobs = resolved.armap
    search = {(j.run, j.seed, j.merge) for j in jobs.search}
    assert {s for r, s, g in search if g == "task_arithmetic" and r == "combined"} == set(range(6))
    assert {s for _, s, g in search if g in ("ties", "dare")} == {0}
    direct = {(j.run, j.seed, j.objective) for j in jobs.direct}
    assert direct == {(r, s, o) for r in ("mdlm", "combined") for s in (0, 1, 2) for o in ("dpo", "plain_dpo", "simpo")}
    for o in ("dpo", "plain_dpo", "simpo"):  # each baseline evaluated on the same seeds
        evals = {(e.run, e.seed) for e in jobs.evals if getattr(e, "name", "").startswith(f"dlm_{o}_")}
        assert evals == {(r, s) for r in ("mdlm", "combined") for s in (0, 1, 2)}
    assert not any("/seed4/" in p and "dlm_dpo" in p for p in armap_report_inputs(resolved))
    cfg["armap"].pop("merge_seeds")
    cfg["armap"].pop("dlm_dpo_seeds")
    jobs = resolve(cfg).armap
    assert {j.seed for j in jobs.search if j.merge == "ties"} == set(range(6))
    assert {j.seed for j in jobs.direct} == set(range(6))


def test_a_key_set_twice_is_refused_naming_it_and_its_lines(tmp_path):
    """YAML keeps the last of two equal keys silently, which drops a setting: the repo's config files set
    none twice, and a user's file that does is refused by the DAG build and the planner, naming the key
    (its dotted path) and both lines, before any job."""
    import subprocess
    import sys

    from ar2dlm.pipeline.config import ConfigError, read_config_file
    from tests.conftest import run_snakemake

    for path in sorted((REPO / "config").rglob("*.yaml")) + [REPO / "slurm" / "config.yaml"]:
        read_config_file(path)
    user = tmp_path / "mine.yaml"
    user.write_text("preset: smoke\ntraining:\n  lr: 1e-3\n  warmup_steps: 2\n  lr: 2e-3\n")
    with pytest.raises(ConfigError, match=r"'training.lr': set twice in .*mine.yaml \(lines 3 and 5\)"):
        read_config_file(user)
    anchors = tmp_path / "anchors.yaml"  # a merge key's keys may be overridden, as YAML allows
    anchors.write_text("a: &base {x: 1, y: 2}\nb: {<<: *base, x: 3}\n")
    assert read_config_file(anchors)["b"] == {"x": 3, "y": 2}
    work = tmp_path / "run"
    work.mkdir()
    proc = run_snakemake(["all_tables", "-n", "--configfile", str(user)], work)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "'training.lr': set twice" in out, out[-2000:]
    plan = [sys.executable, "-m", "ar2dlm.plan", "--configfile", str(user)]
    proc = subprocess.run(plan, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and "'training.lr': set twice" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_token_budgets_and_prompt_set_sizes_are_checked_against_their_sources():
    import copy

    from ar2dlm.pipeline.checks import check_config
    from ar2dlm.pipeline.config import ConfigError, merge_preset

    paper = merge_preset({"preset": "paper"}, REPO / "config")
    check_config(paper)
    long = copy.deepcopy(paper)
    long["runs"]["ed_long"]["training"]["steps"] = 190000  # 99.6B tokens from a 50B-token stream
    with pytest.raises(ConfigError, match=r"runs\.ed_long\.training.*99\.6B tokens.*50\.0B"):
        check_config(long)
    math = copy.deepcopy(paper)
    math["data"]["prompt_sets"]["competition_math"]["n"] = 2000
    with pytest.raises(ConfigError, match=r"data\.prompt_sets\.competition_math\.n.*2000.*holds 1744"):
        check_config(math)


def test_empty_or_broken_local_data_files_are_named_at_dag_build(dry_run, tmp_path):
    empty, broken = tmp_path / "empty.jsonl", tmp_path / "broken.jsonl"
    empty.write_text("")
    broken.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "d",\n')
    bench = {
        "kind": "code",
        "source": "path",
        "format": "evalplus",
        "dataset": "humaneval",
        "style": "body",
        "max_new_tokens": 16,
        "parallel": 1,
        "limit": None,
        "n_samples": 1,
        "temperature": 0,
    }
    prefs = {
        "source": "hub",
        "path": "json",
        "name": None,
        "train_split": "train",
        "eval_split": "train",
        "prompt_field": "prompt",
        "chosen_field": "chosen",
        "rejected_field": "rejected",
    }
    for override, key, words in (
        (
            {"eval": {"benchmarks": {"mine": {**bench, "path": str(empty)}}}},
            "eval.benchmarks.mine.path",
            f"{empty} is empty",
        ),
        (
            {"data": {"preferences": {"domains": {"helpful": {**prefs, "data_files": {"train": str(broken)}}}}}},
            "data.preferences.domains.helpful.data_files",
            f"{broken}, line 2: not valid JSON",
        ),
        (
            {"data": {"preferences": {"domains": {"helpful": {**prefs, "data_files": str(tmp_path / "*.parquet")}}}}},
            "data.preferences.domains.helpful.data_files",
            "matches no file",
        ),
    ):
        proc = dry_run(override)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"config key '{key}'" in out and words in out, out[-2000:]


def test_the_tiny_claims_read_benchmarks_the_tiny_teacher_can_do():
    """Every tiny claim that compares conversion runs reads a benchmark where the tiny teacher's
    measured score (docs/tiny/teacher_scores.json, benchmarks/teacher_scores.py) is at least
    TEACHER_FLOOR, so the runs can show a difference (arithmetic, 0.17, reads none)."""
    from ar2dlm.evaluation.suite import BENCHMARK_KINDS
    from ar2dlm.pipeline.claims import TEACHER, TRAINING, declared_claims
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.reporting.claims import TEACHER_FLOOR

    cfg = merge_preset({"preset": "tiny"}, REPO / "config")
    scores = json.loads((REPO / "docs" / "tiny" / "teacher_scores.json").read_text())["teacher_scores"]
    read = set()
    for c in declared_claims(cfg):
        if c.armap or c.against == TEACHER:  # AR-MAP's gamma claims; the teacher as one of the arms
            continue
        if isinstance(c.benchmark, list):  # the mean over those the teacher can do: at least one of them
            assert any(scores[b]["value"] >= TEACHER_FLOOR for b in c.benchmark), (c.id, c.benchmark)
            read.update(b for b in c.benchmark if scores[b]["value"] >= TEACHER_FLOOR)
            continue
        bench = c.benchmark
        if bench == TRAINING or not BENCHMARK_KINDS[cfg["eval"]["benchmarks"][bench]["kind"]].scored:  # not scores
            continue
        assert bench in scores, f"{bench}: no measured teacher score; rerun benchmarks/teacher_scores.py"
        # pass@k never falls below pass@1 of the same samples: a pass@1 record bounds a pass@k claim's metric
        recorded = c.metric if "_pass@" not in c.metric else c.metric.rsplit("@", 1)[0] + "@1"
        assert scores[bench]["metric"] == recorded, (c.id, "the record holds another metric", scores[bench])
        assert scores[bench]["value"] >= TEACHER_FLOOR, (c.id, bench, scores[bench])
        read.add(bench)
    assert scores["arithmetic"]["value"] < TEACHER_FLOOR and "arithmetic" not in read


def test_a_staged_run_waits_for_its_source_and_is_launched_from_its_final_checkpoint(dry_run):
    proc = dry_run(
        {
            "runs": {
                "opd_from_ed": {
                    "method": "opdlm",
                    "init": {"run": "ed"},
                    "distill": {"rollout_length": 8},
                    "training": {"steps": 4},
                }
            },
            "studies": {"staged": {"runs": ["opd_from_ed"], "evals": ["synthetic_code"], "seeds": [1]}},
        },
        target="results/models/tiny/opd_from_ed/seed1/train.json",
        printshell=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "results/models/tiny/ed/seed1/train.json" in out  # the source run (same model and seed) comes first
    assert '--init-from "results/models/tiny/ed/seed1/train.json"' in out


def test_every_reported_number_has_its_source_unit_and_protocol():
    """config/reported.yaml: each number under a table some preset makes, with where it comes from (a paper
    summary's sentence or a named outside source), a unit of the file's list and how its protocol differs."""
    from ar2dlm.pipeline.config import merge_preset

    reported = yaml.safe_load((REPO / "config" / "reported.yaml").read_text())
    tables = {"armap/main"}
    for preset in ("tiny", "tiny_full", "paper"):
        tables |= set(merge_preset({"preset": preset}, REPO / "config")["studies"])
    units = {"pp", "pp gain", "% rel.", "x", "tokens", "FLOPs"}
    assert set(reported) <= tables, set(reported) - tables
    for table, rows in reported.items():
        for row in rows:
            assert set(row) == {"source", "model", "benchmark", "value", "unit", "protocol", "where"}, (table, row)
            assert row["unit"] in units and row["protocol"] and row["where"], (table, row)
            # a sentence of the paper's own summary, or an outside source named with its arXiv id
            summary = row["where"].startswith(f"{row['source']} summary: «")
            assert summary or "(arXiv" in row["source"], (table, row)


def test_scientific_notation_reads_as_a_number():
    """``lr: 1e-3`` is a string to YAML 1.1 (PyYAML, Snakemake's loader); the config reads it as the
    number every ML config means, wherever a number goes."""
    from ar2dlm.pipeline.checks import checked_config
    from ar2dlm.provenance import deep_merge

    smoke = yaml.safe_load((REPO / "config" / "presets" / "smoke.yaml").read_text())
    override = yaml.safe_load("training: {lr: 1e-3, weight_decay: 5E-2}\narmap: {gamma: {grid: [0, 1e0, 2]}}")
    assert override["training"]["lr"] == "1e-3"  # what YAML 1.1 hands over
    merged = checked_config(deep_merge(smoke, override), REPO / "config").config
    assert merged["training"]["lr"] == 0.001 and merged["training"]["weight_decay"] == 0.05
    assert merged["armap"]["gamma"]["grid"] == [0, 1.0, 2]


def test_a_machine_without_the_sandbox_learns_it_before_any_job(tmp_path):
    """No ``bwrap`` on PATH: the DAG build stops in one line naming the package (a dry run warns)."""
    import os
    import shutil
    from pathlib import Path

    from tests.conftest import run_snakemake

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is not installed here")
    hidden = tmp_path / "bin"  # every program of PATH but bwrap
    hidden.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for f in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if f.name != "bwrap" and not (hidden / f.name).exists():
                (hidden / f.name).symlink_to(f)
    work = tmp_path / "run"
    work.mkdir()
    proc = run_snakemake(["results/data/code/eval.jsonl", "--cores", "1"], work, PATH=str(hidden))
    assert (
        proc.returncode != 0 and "prerequisite missing" in proc.stderr and "apt-get install bubblewrap" in proc.stderr
    )
    assert not (work / "results").exists()
    proc = run_snakemake(["all_tables", "-n"], work, PATH=str(hidden))
    assert proc.returncode == 0 and "Warning (dry run): generated code runs in a bubblewrap sandbox" in proc.stderr


def test_lengths_beyond_a_models_positions_are_refused_at_dag_build(tmp_path):
    """A RoPE model runs past its positions without an error, so the DAG build compares every length the
    config sets with the positions of the models it feeds: the preset's architecture, or a checkpoint's
    config.json (local or in the hub cache)."""
    import json

    from ar2dlm.pipeline.checks import checked_config
    from ar2dlm.pipeline.config import ConfigError

    config = REPO / "config"
    smoke = checked_config({"preset": "smoke"}, config).config
    positions = smoke["models"]["tiny"]["arch"]["max_position_embeddings"]
    checked_config({"preset": "smoke", "eval": {"teacher_code": {"max_new_tokens": positions}}}, config)
    with pytest.raises(
        ConfigError, match=rf"'eval.teacher_code.max_new_tokens': {positions + 1} tokens, more .*'tiny'"
    ):
        checked_config({"preset": "smoke", "eval": {"teacher_code": {"max_new_tokens": positions + 1}}}, config)
    with pytest.raises(ConfigError, match=r"'armap.dpo.max_length'"):
        checked_config({"preset": "smoke", "armap": {"dpo": {"max_length": 2 * positions}}}, config)
    # a checkpoint's own positions: a hub model given as a local folder
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 64}))
    hub = {"source": "hub", "hub_id": "Qwen/Qwen3-0.6B-Base", "model_path": str(folder), "revision": None}
    with pytest.raises(
        ConfigError, match=r"tokens, more than model 'local' has positions \(max_position_embeddings 64\)"
    ):
        checked_config({"preset": "smoke", "models": {"local": hub}}, config)
