"""dtype: auto resolves per device (bf16 only where it is computed natively), whatever CPU runs the tests."""

import pytest
import torch

from ar2dlm.core.precision import planned_dtype, resolve_dtype
from ar2dlm.pipeline.checks import bf16_keys, emulated_bf16_warning
from ar2dlm.pipeline.config import merge_preset
from ar2dlm.reporting.tables import machine_note
from ar2dlm.training.schedule import autocast
from tests.conftest import REPO


@pytest.fixture
def hardware(monkeypatch):
    """Pretend to be a machine: torch's kernel level, the CPU's bf16 instructions, a CUDA device."""

    def _set(kernels="AVX2", avx512_bf16=False, amx=False, cuda=None):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: kernels)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda is not None)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0) if cuda else (7, 5))

    return _set


@pytest.mark.parametrize(
    "facts, cpu",
    [
        ({"kernels": "AVX512", "avx512_bf16": True}, "bf16"),  # Sapphire Rapids, Zen 4
        ({"kernels": "AVX512", "amx": True}, "bf16"),
        ({"kernels": "AVX512"}, "fp32"),  # Skylake-X, Cascade Lake: AVX-512 without bf16
        ({"kernels": "AVX2", "avx512_bf16": True, "amx": True}, "fp32"),  # ATEN_CPU_CAPABILITY=avx2 on a bf16 CPU
        ({"kernels": "AVX2"}, "fp32"),  # Zen 1-3, Intel client CPUs
        ({"kernels": "DEFAULT"}, "fp32"),  # ARM (Apple M1, Graviton)
    ],
)
def test_auto_on_a_cpu_is_bf16_only_where_native(hardware, facts, cpu):
    hardware(**facts)
    assert resolve_dtype("auto", "cpu") == cpu
    assert resolve_dtype("auto", torch.device("cpu")) == cpu
    assert resolve_dtype("fp32", "cpu") == "fp32" and resolve_dtype("bf16", "cpu") == "bf16"  # asked for: kept


@pytest.mark.parametrize("cuda_bf16, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_on_cuda_follows_the_gpu_not_the_cpu(hardware, cuda_bf16, expected):
    hardware(kernels="AVX2", cuda=cuda_bf16)  # a GPU node whose CPU has no bf16
    assert resolve_dtype("auto", torch.device("cuda:3")) == expected
    assert resolve_dtype("auto", "cpu") == "fp32"


def test_resolution_refuses_an_unknown_dtype_and_autocast_an_unresolved_one():
    with pytest.raises(ValueError, match="unknown dtype 'fp16'"):
        resolve_dtype("fp16", "cpu")
    with pytest.raises(ValueError, match="resolved dtype"):
        autocast("auto", "cpu")
    with autocast("bf16", "cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast("fp32", "cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_the_planner_sizes_auto_as_bf16_on_gpus():
    assert planned_dtype("auto", cuda=True) == "bf16" and planned_dtype("auto", cuda=False) == "fp32"
    assert planned_dtype("fp32", cuda=True) == "fp32" and planned_dtype("bf16", cuda=False) == "bf16"


def _preset(name, **over):
    return merge_preset({"preset": name, **over}, REPO / "config")


def test_tiny_presets_ask_for_auto_and_smoke_for_fp32():
    for name in ("tiny", "tiny_full"):
        c = _preset(name)
        assert c["training"]["dtype"] == c["eval"]["decoding"]["dtype"] == "auto"
        assert {m["pretrain"]["dtype"] for m in c["models"].values()} == {"auto"}
        assert bf16_keys(c) == []
    smoke = _preset("smoke")
    assert smoke["training"]["dtype"] == smoke["eval"]["decoding"]["dtype"] == "fp32"
    assert {m["pretrain"]["dtype"] for m in smoke["models"].values()} == {"fp32"}


def test_explicit_bf16_on_an_emulating_cpu_warns_naming_cpu_keys_and_slowdown(hardware):
    c = _preset("tiny", training={"dtype": "bf16"}, eval={"decoding": {"dtype": "bf16"}})
    hardware(kernels="AVX2")
    warning = emulated_bf16_warning(c)
    assert "training.dtype" in warning and "eval.decoding.dtype" in warning
    assert "25x slower" in warning and "AVX2 kernels" in warning and "dtype: auto" in warning
    assert emulated_bf16_warning(_preset("tiny")) is None  # auto never warns
    hardware(kernels="AVX512", amx=True)
    assert emulated_bf16_warning(c) is None  # native bf16
    hardware(kernels="AVX2", cuda=True)
    assert emulated_bf16_warning(c) is None  # jobs on a bf16 GPU
    hardware(kernels="AVX2")
    assert emulated_bf16_warning(_preset("paper")) is None  # a cluster's jobs do not run on this CPU


def test_dag_build_warns_on_explicit_bf16_where_it_is_emulated(dry_run, monkeypatch):
    # ATEN_CPU_CAPABILITY=avx2 makes any x86 CPU one without native bf16 (ARM has none to begin with)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    proc = dry_run({"training": {"dtype": "bf16"}})
    assert proc.returncode == 0, proc.stderr
    assert "Warning: training.dtype ask(s) for bf16" in proc.stderr and "25x slower" in proc.stderr


def test_table_footer_names_the_machine_and_resolved_dtypes():
    def result(cpu, kernels, dtype):
        return {"versions": {"machine": {"cpu": cpu, "kernels": kernels, "dtype": dtype, "cuda": None}}}

    note = machine_note(
        [
            ("training", result("AMD EPYC", "AVX2", "fp32")),
            ("evaluation", result("AMD EPYC", "AVX2", "fp32")),
            ("evaluation", result("Xeon 8480", "AVX512", "bf16")),
        ]
    )
    assert (
        note == "AMD EPYC (AVX2 kernels): training fp32, evaluation fp32; Xeon 8480 (AVX512 kernels): evaluation bf16"
    )
