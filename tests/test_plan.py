"""The memory planner: the paper preset fits 80 GB GPUs, jobs that cannot fit are named, and the
estimate is the measured peak of real CPU steps within 25%."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ar2dlm.pipeline.config import ConfigError, merge_preset
from ar2dlm.pipeline.resolved import resolve
from ar2dlm.plan.__main__ import main
from ar2dlm.plan.armap import STOP_FRACTION, DpoRecipe, dpo_step_flops, over_runtime, segmented
from ar2dlm.plan.memory import GB, QWEN3_SHAPES, Launch, estimate, peak, plan_jobs, unfit
from ar2dlm.plan.one_gpu import dpo_parts, gamma_parts, plan_one_gpu_jobs, unfit_one_gpu
from ar2dlm.plan.tokenize import TARGET_HOURS, plan_tokenize, plan_tokenize_jobs

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "presets" / "paper.yaml"


def paper():
    return merge_preset(yaml.safe_load(PAPER.read_text()), REPO / "config")


def test_every_paper_job_fits_80gb_gpus_and_the_profile_runtime():
    config = paper()
    plans = plan_jobs(resolve(config))
    assert len(plans) == 30 and not unfit(plans)
    for p in plans:
        assert p.peak_gb <= 0.9 * 80 and p.launch.nodes <= config["cluster"]["max_nodes"]
        assert p.segments == 1 or p.launch.nodes == config["cluster"]["max_nodes"], p.job  # more nodes before segments
    by_job = {p.job: p for p in plans}
    ed = by_job["qwen3_4b/ed"].launch  # 256 rows x 2 x 2048 tokens on one node's 8 GPUs: with recomputation only
    assert ed.nodes == 1 and ed.activation_checkpointing
    assert by_job["qwen3_4b/ed_long"].launch.nodes == 8  # 50B tokens: 81 h on 4 nodes, 41 h on 8


def test_the_50b_token_stream_is_tokenised_by_parallel_jobs_within_12_hours():
    config = paper()
    plans = {(t.source, t.seq_len): t for t in plan_tokenize_jobs(resolve(config))}
    stream = plans[("stream", 2048)]
    assert stream.tokens == 50e9 and stream.shards > 1 and stream.hours <= TARGET_HOURS <= 12
    assert stream.runtime_minutes / 60 >= 2 * stream.hours  # a slower CPU still finishes within the job's limit
    assert plans[("subset", 2048)].shards == 1  # 0.8B tokens: one job
    config["data"]["corpus"]["stream_tokens"] = 10**11
    double = plan_tokenize(config, "stream", "documents", 2048)
    assert double.shards == 2 * stream.shards  # twice the tokens, twice the jobs, the same wall time
    assert double.hours == pytest.approx(stream.hours)
    smoke = merge_preset({"preset": "smoke"}, REPO / "config")  # no cluster: one job of 4 workers
    assert {(t.shards, t.workers) for t in plan_tokenize_jobs(resolve(smoke))} == {(1, 4)}


def test_the_cli_names_the_jobs_that_fit_no_launch(capsys):
    assert main(["--configfile", str(PAPER)]) == 0
    out = capsys.readouterr().out
    stream = plan_tokenize(paper(), "stream", "documents", 2048)
    assert "qwen3_8b/opd" in out
    assert f"| stream/documents_len2048 | 50.00B | {stream.shards} | {stream.workers} |" in out
    assert main(["--configfile", str(PAPER), "--gpu-memory-gb", "12"]) == 1
    err = capsys.readouterr().err
    assert "qwen3_8b/ed:" in err and "raise training.grad_accum" in err


def test_parts_follow_the_launch():
    run = resolve(paper()).run("ed").as_dict()
    shape = QWEN3_SHAPES["Qwen/Qwen3-8B-Base"]
    one = estimate(shape, run, Launch(1, 8, 4, True, False))
    two = estimate(shape, run, Launch(2, 8, 4, True, False))
    assert two["optimizer"] == pytest.approx(one["optimizer"] / 2)  # AdamW's moments are sharded
    assert two["activations"] == pytest.approx(one["activations"])  # same rows per GPU
    full = estimate(shape, run, Launch(1, 8, 4, False, False))
    assert full["activations"] > 5 * one["activations"]  # recomputation keeps each layer's input only
    cpu = estimate(shape, run, Launch(1, 8, 4, True, False, cuda=False))
    assert one["masks"] == 0 and cpu["masks"] > 0  # flex BlockMasks on CUDA, dense 2L masks on CPU


@pytest.mark.parametrize("name", ["small mdlm", "small repr_align", "wide efficient_dlm (checkpointed)"])
def test_the_estimate_is_the_measured_cpu_peak_within_25_percent(name):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from train_memory import cases, estimated

    case = next(c for c in cases(False) if c["name"] == name)
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "train_memory.py"), "--case", json.dumps(case)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])["peak_gb"]
    assert estimated(case)["estimate_gb"] == pytest.approx(measured, rel=0.25)


def test_a_job_the_cluster_cannot_hold_stops_the_dag_build(tmp_path):
    from tests.conftest import run_snakemake

    override = tmp_path / "small_gpus.yaml"
    override.write_text(yaml.safe_dump({"preset": "paper", "cluster": {**paper()["cluster"], "gpu_memory_gb": 12}}))
    proc = run_snakemake(["-n", "all_tables", "--configfile", str(PAPER), str(override)], tmp_path, timeout=120)
    out = proc.stdout + proc.stderr
    gamma = next(j for j in plan_one_gpu_jobs(resolve(paper())) if j.job == "gamma_search/qwen3_8b")
    assert proc.returncode != 0 and "do not fit the config's cluster" in out
    assert "qwen3_8b/ed:" in out and f"gamma_search/qwen3_8b: needs {gamma.peak_gb:.0f} GB on one GPU" in out


def test_peak_is_the_larger_phase():
    parts = {
        "parameters": 1.0,
        "gradients": 1.0,
        "optimizer": 2.0,
        "teacher": 0.5,
        "activations": 3.0,
        "logits": 1.0,
        "masks": 0.0,
    }
    assert peak(parts) == 8.5
    assert peak({**parts, "rollout": 10.0}) == 13.5 and GB == 1e9
    # checkpointed: the logits' phase and the recomputed layer's do not overlap
    assert peak({**parts, "recompute": 0.5}) == 8.5 and peak({**parts, "recompute": 4.0}) == 11.5


@pytest.mark.parametrize("act, mlp_trained", [(2, True), (2, False), (4, True)])
def test_a_layers_saved_activations_are_what_autograd_saves(act, mlp_trained):
    """``layer_activation_bytes`` against the tensors autograd saves in transformers' Qwen3 decoder
    layer (sdpa attention), counted by storage, at a shape whose widths all differ."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    from ar2dlm.plan.memory import Shape

    shape = Shape(hidden=96, layers=1, heads=6, kv_heads=2, head_dim=32, intermediate=160, vocab=64, tied=True)
    cfg = shape.qwen3_config(attn_implementation="sdpa")
    dtype = torch.bfloat16 if act == 2 else torch.float32
    layer = Qwen3DecoderLayer(cfg, 0).to(dtype)
    layer.mlp.requires_grad_(mlp_trained)
    tokens = 40
    x = torch.randn(1, tokens, shape.hidden, dtype=dtype, requires_grad=True)
    rotary = Qwen3RotaryEmbedding(cfg)(x, torch.arange(tokens)[None])  # shared by every layer: not the layer's
    shared = {t.untyped_storage().data_ptr() for t in (*rotary, *layer.parameters())}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in shared:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=None, position_embeddings=rotary)
    assert sum(saved.values()) == shape.layer_activation_bytes(act, mlp_trained) * tokens


def test_evaluation_and_armap_jobs_fit_one_80gb_gpu_and_the_unfit_are_named():
    config = paper()
    jobs = plan_one_gpu_jobs(resolve(config))
    assert {
        "evaluate/qwen3_8b/aime24",
        "evaluate/qwen3_8b/gpqa_diamond",
        "dpo_teacher/qwen3_8b",
        "dlm_dpo/qwen3_8b",
        "armap_spectra/qwen3_8b",
        "gamma_search/qwen3_8b",
    } <= {j.job for j in jobs}
    assert all(j.fits for j in jobs), [j.job for j in jobs if not j.fits]
    small = {**config, "cluster": {**config["cluster"], "gpu_memory_gb": 40}}
    lines = unfit_one_gpu(plan_one_gpu_jobs(resolve(small)), 40)
    gamma = next(j for j in jobs if j.job == "gamma_search/qwen3_8b")
    assert 0.9 * 40 < gamma.peak_gb < 0.9 * 80  # the fp32 merge (33 GB) and one forward's scoring
    assert any(
        line.startswith(f"gamma_search/qwen3_8b: needs {gamma.peak_gb:.0f} GB on one GPU, over 90% of 40 GB")
        for line in lines
    )
    assert not any(line.startswith("dpo_teacher/") for line in lines)  # LoRA DPO of 8B fits 40 GB


def test_lora_is_what_fits_8b_dpo_on_one_gpu():
    shape, cfg = QWEN3_SHAPES["Qwen/Qwen3-8B-Base"], paper()["armap"]["dpo"]
    lora, full = dpo_parts(DpoRecipe(shape, cfg, False)), dpo_parts(DpoRecipe(shape, {**cfg, "lora": None}, False))
    assert (
        sum(full.values()) / GB > 130 > 80 > 30 > sum(lora.values()) / GB
    )  # fp32 weights, gradients, AdamW: 16 B/param
    assert full["reference"] == 0  # a causal model's reference log-probabilities are precomputed
    assert dpo_parts(DpoRecipe(shape, {**cfg, "lora": None}, True))["reference"] == 4 * shape.params


def test_full_dpo_of_8b_is_sharded_over_the_gpus_that_hold_it(tmp_path):
    """Without LoRA, 8B DPO cannot fit one GPU: the planner shards it (FSDP2 trainer) over the
    fewest GPUs of a node that hold it, and the DAG launches it with torchrun on that many."""
    from tests.conftest import run_snakemake

    config = paper()
    full = {
        **config,
        "armap": {
            **config["armap"],
            "dpo": {**config["armap"]["dpo"], "lora": None},
            "dlm_dpo": {**config["armap"]["dlm_dpo"], "lora": None},
        },
    }
    jobs = {j.job: j for j in plan_one_gpu_jobs(resolve(full))}
    for kind in ("dpo_teacher", "dlm_dpo"):
        job = jobs[f"{kind}/qwen3_8b"]
        assert (
            job.fits
            and job.gpus == 4
            and job.parts["weights"] * 4 == pytest.approx(4 * QWEN3_SHAPES["Qwen/Qwen3-8B-Base"].params)
        )
    # 4B: a causal model's fp32 weights, gradients and AdamW (64 GB) with its activations fit one GPU; a DLM's
    # frozen fp32 reference (16 GB more) does not
    assert jobs["dpo_teacher/qwen3_4b"].gpus == 1 and jobs["dlm_dpo/qwen3_4b"].gpus == 2
    assert {j.gpus for j in plan_one_gpu_jobs(resolve(config)) if "dpo" in j.job} == {1}  # LoRA: one GPU
    override = tmp_path / "full_dpo.yaml"
    override.write_text(
        yaml.safe_dump({"preset": "paper", "armap": {"dpo": {"lora": None}, "dlm_dpo": {"lora": None}}})
    )
    proc = run_snakemake(
        ["-n", "-p", "all_tables", "--configfile", str(PAPER), str(override), "--until", "dpo_teacher"],
        tmp_path,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert "--nproc_per_node=4 -m ar2dlm.armap.dpo_run --model" in out, out[-3000:]
    # host memory for the 4 processes that each load the fp32 policy and the bf16 reference before sharding
    host = jobs["dpo_teacher/qwen3_8b"].host_gb
    assert 4 * 6 * QWEN3_SHAPES["Qwen/Qwen3-8B-Base"].params / 1e9 < host < 300
    assert f"mem_mb={round(1000 * host)}," in out
    # each planned DPO job stops with a checkpoint before its runtime, for its retry to resume
    stop = STOP_FRACTION * config["cluster"]["armap_runtime_hours"]["dpo_teacher"]
    assert f"""--launch '{{"gpus": 4, "stop_after_hours": {stop:g}}}'""" in out, out[-3000:]


class _Wildcards(dict):
    """A job's wildcards as Snakemake passes them to a resource function: attributes and keys()."""

    __getattr__ = dict.__getitem__


def test_the_launcher_starts_one_process_torchrun_or_one_torchrun_per_node():
    from ar2dlm.plan.launch import launcher

    assert launcher({}, "py") == "py"
    assert launcher({"gpu": 8}, "py") == "py -m ar2dlm.training.torchrun --standalone --nproc_per_node=8"
    two_nodes = launcher({"gpu": 16, "nodes": 2, "tasks": 16, "mpi": "srun", "cpus_per_gpu": 8}, "py")
    assert two_nodes.startswith(
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --gpus-per-task=8 --gpu-bind=none --cpus-per-task=64 "
        "--kill-on-bad-exit=1 sh -c 'exec py -m ar2dlm.training.torchrun --nnodes=2 --nproc_per_node=8 "
    ), two_nodes
    # a profile's srun job without GPUs: its tasks, no GPU binding
    cpu = launcher({"nodes": 2, "tasks": 4, "mpi": "srun", "cpus_per_task": 3}, "py")
    assert "--nproc_per_node=2" in cpu and "--gpus-per-task" not in cpu and "--cpus-per-task=3" in cpu


def test_the_cluster_plan_gives_each_planned_job_its_resources_launch_and_retries():
    from ar2dlm.plan.launch import DPO_HOST_GB, MERGE_MEM_MB, plan_cluster, tokenize_resources

    config = paper()
    cluster = plan_cluster(resolve(config))
    assert set(cluster.conversions) == {p.job for p in plan_jobs(resolve(config))} and not cluster.unfit()
    resources = cluster.conversion_resources()
    for job, (nodes, tasks, mpi) in {"qwen3_8b/ed": (2, 16, "srun"), "qwen3_8b/opd": (1, 1, "")}.items():
        model, run = job.split("/")
        wc = _Wildcards(model=model, run=run)
        plan = cluster.conversions[job].launch
        got = {k: v(wc) if callable(v) else v for k, v in resources.items()}
        assert got == {
            "nodes": nodes,
            "gpu": plan.gpus,
            "tasks": tasks,
            "tasks_per_gpu": 0,
            "mpi": mpi,
            "runtime": f"{config['cluster']['runtime_hours']}h",
        }, job
        assert json.loads(cluster.conversion_launch(wc)) == {
            "activation_checkpointing": plan.activation_checkpointing,
            "shard_teacher": plan.shard_teacher,
            "gpus": plan.gpus,
            "stop_after_hours": round(STOP_FRACTION * config["cluster"]["runtime_hours"], 2),
        }
    assert cluster.conversion_retries() == max(p.segments for p in cluster.conversions.values()) + 1
    # a LoRA DPO job: one GPU, a DPO host's memory, its runtime; the direct baseline named by its objective
    dpo = {k: v(_Wildcards(model="qwen3_8b")) for k, v in cluster.dpo_resources().items()}
    hours = config["cluster"]["armap_runtime_hours"]
    assert dpo == {"gpu": 1, "mem_mb": 1000 * DPO_HOST_GB, "runtime": round(60 * hours["dpo_teacher"])}
    direct = _Wildcards(model="qwen3_8b", objective="dpo")
    assert cluster.dpo_resources()["runtime"](direct) == round(60 * hours["dlm_dpo"])
    assert json.loads(cluster.dpo_launch(direct))["stop_after_hours"] == round(STOP_FRACTION * hours["dlm_dpo"], 2)
    assert cluster.dpo_retries("dpo_teacher") == cluster.gpu_jobs["dpo_teacher/qwen3_8b"].segments + 1
    bench = cluster.bench_train_resources()
    assert bench["gpu"] == cluster.bench_train.launch.gpus >= 8 and bench["mem_mb"] > 0
    assert tokenize_resources(plan_tokenize(config, "stream", "documents", 2048), False)["mem_mb"] == MERGE_MEM_MB
    # the DAG build's fit check and the CLI's: a GPU too small names the jobs
    small = {**config, "cluster": {**config["cluster"], "gpu_memory_gb": 8}}
    assert any(line.startswith("qwen3_8b/") for line in plan_cluster(resolve(small)).unfit())
    # without a cluster nothing is planned: every job keeps the profile's resources
    none = plan_cluster(resolve(merge_preset({"preset": "smoke"}, REPO / "config")))
    wc = _Wildcards(model="tiny", run="mdlm")
    assert none.conversion_resources() == none.dpo_resources() == none.bench_train_resources() == {}
    assert none.conversion_launch(wc) == none.bench_train_launch() == "{}" and none.conversion_retries() is None
    assert none.unfit() == [] and none.armap_runtime("gamma_search") == {}


def test_every_armap_job_of_the_paper_fits_its_runtime_dpo_in_resumable_segments():
    config = paper()
    jobs = {j.job: j for j in plan_one_gpu_jobs(resolve(config))}
    runtimes = config["cluster"]["armap_runtime_hours"]
    armap = [j for j in jobs.values() if j.job.split("/")[0] in runtimes]
    assert len(armap) == 8 and all(j.time is not None for j in armap) and not over_runtime(jobs.values())
    for j in armap:
        assert j.time.longest_hours <= j.time.runtime_hours == runtimes[j.job.split("/")[0]]
        if j.time.segments > 1:  # only DPO resumes; a longer run takes the jobs it needs
            assert j.job.split("/")[0] in ("dpo_teacher", "dlm_dpo")
            assert j.time.hours > STOP_FRACTION * j.time.runtime_hours * (j.time.segments - 1)
    dlm = jobs["dlm_dpo/qwen3_8b"].time
    assert dlm.segments >= 4 and dlm.hours > 3 * runtimes["dlm_dpo"]  # 2000 steps of 2L rows, two ELBO draws each
    # a runtime the gamma search cannot fit fails the plan, naming the job; the CLI exits 1
    short = {**config, "cluster": {**config["cluster"], "armap_runtime_hours": {**runtimes, "gamma_search": 1}}}
    lines = over_runtime(plan_one_gpu_jobs(resolve(short)))
    assert len(lines) == 2 and lines[1].startswith("gamma_search/qwen3_8b: takes") and "runtime of 1 h" in lines[1]


def test_each_direct_baseline_is_planned_and_needs_its_runtime():
    """Plain DLM DPO, like every direct baseline configured, is planned as VRPO's DPO is (a policy and its
    reference on the DLM's rows); a cluster that gives it no runtime is refused by key."""
    from ar2dlm.pipeline.checks import check_config

    config = paper()
    config["armap"]["dlm_plain_dpo"] = config["armap"]["dlm_dpo"]
    with pytest.raises(ConfigError, match=r"'cluster\.armap_runtime_hours\.dlm_plain_dpo'.*need a runtime"):
        check_config(config)
    config["cluster"]["armap_runtime_hours"]["dlm_plain_dpo"] = config["cluster"]["armap_runtime_hours"]["dlm_dpo"]
    jobs = {j.job: j for j in plan_one_gpu_jobs(check_config(config))}
    for model in ("qwen3_4b", "qwen3_8b"):
        plain, vrpo = jobs[f"dlm_plain_dpo/{model}"], jobs[f"dlm_dpo/{model}"]
        assert plain.parts == vrpo.parts and plain.time == vrpo.time


def test_the_cli_fails_when_an_armap_job_overruns(tmp_path, capsys):
    config = yaml.safe_load(PAPER.read_text())
    config["cluster"]["armap_runtime_hours"]["gamma_search"] = 1
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--configfile", str(path)]) == 1
    captured = capsys.readouterr()
    assert "gamma_search/qwen3_8b: takes" in captured.err and "| dlm_dpo/qwen3_8b | 1 |" in captured.out


@pytest.mark.parametrize("train_h", [1.0, 21.0, 22.0, 50.0, 90.0])
def test_segments_each_fit_the_runtime_and_cover_the_training(train_h):
    load, first, last, runtime = 0.1, 0.6, 0.5, 24.0
    t = segmented(train_h * 3600, load * 3600, first * 3600, last * 3600, runtime)
    budget = STOP_FRACTION * runtime - load  # training (and the first job's scoring) per job
    assert t.fits and t.longest_hours <= runtime
    assert t.segments * budget - first >= train_h > (t.segments - 1) * budget - first  # as few jobs as cover it
    assert t.hours == pytest.approx(t.segments * load + first + train_h + last)
    stuck = segmented(3600, 3600 * 0.95 * runtime, 0, 0, runtime)  # loading alone passes the stop
    assert stuck.segments == 0 and not stuck.fits and stuck.hours == pytest.approx(0.95 * runtime + 1)


def test_armap_memory_and_time_count_the_2l_layout_and_the_configured_length():
    shape, config = QWEN3_SHAPES["Qwen/Qwen3-8B-Base"], paper()
    one, two = gamma_parts(shape, 8, 2048, False), gamma_parts(shape, 8, 2048, True)
    assert two["activations"] == pytest.approx(2 * one["activations"]) and two["logits"] == one["logits"]
    assert gamma_parts(shape, 8, 4096, True)["activations"] == pytest.approx(2 * two["activations"])
    # logits at masked positions only: a few GB at 8B, not 8 x 4096 x 151936 in bf16 and fp32 (60 GB)
    assert two["logits"] / GB < 6
    cfg = config["armap"]["dlm_dpo"]
    flat, layered = dpo_parts(DpoRecipe(shape, cfg, True, False)), dpo_parts(DpoRecipe(shape, cfg, True, True))
    assert layered["activations"] > 1.9 * flat["activations"]
    assert (
        dpo_parts(DpoRecipe(shape, {**cfg, "elbo_samples": 4}, True, True))["activations"]
        > 1.5 * layered["activations"]
    )
    assert dpo_step_flops(DpoRecipe(shape, cfg, True, True)) > 1.8 * dpo_step_flops(DpoRecipe(shape, cfg, True, False))
    longer = {**config, "armap": {**config["armap"], "dpo": {**config["armap"]["dpo"], "max_length": 4096}}}

    def gamma(c):
        return next(j for j in plan_one_gpu_jobs(resolve(c)) if j.job == "gamma_search/qwen3_8b")

    assert gamma(longer).peak_gb > gamma(config).peak_gb and gamma(longer).time.hours > 2 * gamma(config).time.hours


def test_on_policy_decoding_pays_the_per_forward_overhead():
    """Each rollout forward costs its bandwidth-bound reads plus the model's fixed cost per layer:
    at 8B the overhead, not the bandwidth, bounds on-policy decoding (about 5x)."""
    from ar2dlm.methods.distillation import FORWARD_OVERHEAD_MS_PER_LAYER, decode_seconds

    config = paper()
    run, shape = resolve(config).run("opd").as_dict(), QWEN3_SHAPES["Qwen/Qwen3-8B-Base"]
    launch = Launch(nodes=1, gpus_per_node=8, rows=8, activation_checkpointing=False, shard_teacher=False)
    without = decode_seconds(shape, run, launch, {**config["cluster"], "forward_overhead_ms_per_layer": 0.0})
    with_overhead = decode_seconds(shape, run, launch, config["cluster"])
    length = run["training"]["seq_len"]
    overhead = length * shape.layers * config["cluster"]["forward_overhead_ms_per_layer"] / 1e3
    assert with_overhead == pytest.approx(without + overhead)
    assert 3 < with_overhead / without < 10
    default = {k: v for k, v in config["cluster"].items() if k != "forward_overhead_ms_per_layer"}
    assert decode_seconds(shape, run, launch, default) == pytest.approx(
        without + length * shape.layers * FORWARD_OVERHEAD_MS_PER_LAYER / 1e3
    )
    assert decode_seconds(shape, resolve(config).run("opd_off").as_dict(), launch, config["cluster"]) == 0.0


def test_the_planner_refuses_a_config_the_dag_build_refuses(tmp_path):
    """A misspelt key plans nothing (it would plan on the default 80 GB GPUs), naming the key."""
    import subprocess
    import sys

    typo = tmp_path / "typo.yaml"
    typo.write_text("preset: paper\ncluster: {gpu_memroy_gb: 40}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ar2dlm.plan", "--configfile", str(typo)], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "'gpu_memroy_gb' was unexpected" in proc.stderr and not proc.stdout


TRACE = """
import json, sys
from dataclasses import asdict
from ar2dlm.pipeline.config import ConfigError, merge_preset
from ar2dlm.pipeline.resolved import resolve
from ar2dlm.plan.trace import trace_job
config = merge_preset(
    {"preset": "paper", "cluster": {"gpus_per_node": int(sys.argv[2])}, "runs": {"opd": {"models": ["qwen3_0_6b"]}}},
    sys.argv[3],
)
print(json.dumps(asdict(trace_job(resolve(config), sys.argv[1]))))
"""


@pytest.mark.parametrize("job, gpus", [("qwen3_0_6b/mdlm", 2), ("qwen3_0_6b/ra", 8), ("qwen3_0_6b/opd", 4)])
def test_a_step_traced_on_fake_ranks_at_the_real_shape_is_within_its_plan(job, gpus):
    """A paper job's training step traced at the Qwen3-0.6B shape on 2, 4 and 8 fake ranks (fake tensors,
    a fake process group: ar2dlm.plan.trace; OPDLM's on-policy run with its rollout at its largest):
    each rank holds its share of the fp32 parameters and twice that in Adam's state, a teacher its bf16
    replica, and the planner's peak is within 15% of the trace."""
    proc = subprocess.run(
        [sys.executable, "-c", TRACE, job, str(gpus), str(REPO / "config")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    traced = json.loads(proc.stdout.strip().splitlines()[-1])
    params = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"].params
    assert traced["world"] == gpus and traced["parts"]["Sharded Param"] == pytest.approx(
        4 * params / gpus / 1e9, rel=0.02
    )
    assert traced["parts"]["OptState"] == pytest.approx(2 * traced["parts"]["Sharded Param"], rel=0.02)
    if job.endswith("/ra"):  # the teacher read for its hidden states: the decoder alone, bf16, replicated
        decoder = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"].decoder_params
        assert traced["parts"]["Teacher"] == pytest.approx(2 * decoder / 1e9, rel=0.02)
    if job.endswith("/opd"):  # the distillation teacher with its head (tied: the same parameters)
        assert traced["parts"]["Teacher"] == pytest.approx(2 * params / 1e9, rel=0.02)
    assert abs(traced["planned_gb"] / traced["peak_gb"] - 1) <= 0.15, traced


def test_a_dpo_step_through_trl_traced_at_the_real_shape_is_within_its_plan():
    """AR-MAP's LoRA DPO of the paper preset on the DLM (TRL's DPOTrainer with the project's ELBO
    scoring; the teacher's plain DPOTrainer is in benchmarks/trace_memory.py) traced at the 4B shape
    with fake tensors: the frozen bf16 weights are all there, and the planner's peak is within 15% of
    the trace."""
    job = "dlm_dpo/qwen3_4b"
    script = (
        "import json, sys\nfrom dataclasses import asdict\nfrom ar2dlm.pipeline.config import merge_preset\n"
        "from ar2dlm.pipeline.resolved import resolve\nfrom ar2dlm.plan.trace import trace_job\n"
        "print(json.dumps(asdict(trace_job(resolve(merge_preset({'preset': 'paper'}, sys.argv[2])), sys.argv[1]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, job, str(REPO / "config")], capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    traced = json.loads(proc.stdout.strip().splitlines()[-1])
    weights = 2 * QWEN3_SHAPES["Qwen/Qwen3-4B-Base"].params / 1e9  # bf16, tied head once
    assert traced["parts"]["Parameter"] == pytest.approx(weights, rel=0.1)  # and the LoRA adapters
    assert abs(traced["planned_gb"] / traced["peak_gb"] - 1) <= 0.15, traced
