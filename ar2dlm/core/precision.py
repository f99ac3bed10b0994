"""The floating-point type a job computes in.

``dtype: auto`` (the tiny presets' setting) resolves in each job, on the device it runs on, to
bf16 where that device computes bf16 natively and to fp32 otherwise:

- a CUDA device: bf16 when it has bf16 arithmetic (Ampere and newer), not counting emulation;
- a CPU: bf16 when torch dispatches its kernels at an AVX-512 level (``ATEN_CPU_CAPABILITY``
  lowers that level, so a simulated AVX2 CPU counts as one) and the processor has the
  AVX512_BF16 or AMX instructions. Without them torch emulates bf16 matrix products about 25x
  slower than fp32 (measured on an AVX2-only AMD EPYC: 512x512 matmul 201 ms in bf16, 3.9 ms in
  fp32), so fp32 is the fast choice there; ARM CPUs resolve to fp32 too.

``bf16`` and ``fp32`` asked for explicitly are kept as asked (the DAG build warns when bf16 would
be emulated on the machine its jobs run on).
"""

from __future__ import annotations

DTYPES = ("fp32", "bf16", "auto")
SLOWDOWN = 25  # emulated bf16 against fp32 matrix products on a CPU without native bf16


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively, as torch dispatches them."""
    import torch

    kernels = torch.backends.cpu.get_cpu_capability()
    return kernels.upper().startswith("AVX512") and bool(
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )


def cuda_native_bf16(device=None) -> bool:
    """Whether ``device`` (default: the current one) has bf16 arithmetic: compute capability 8.0
    and newer (Ampere, Hopper). Asked of that device, so a rank never touches another's GPU."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8


def resolve_dtype(requested: str, device) -> str:
    """``fp32`` or ``bf16``: what a job on ``device`` (a torch.device or its type, "cpu" / "cuda")
    computes in when its config asks for ``requested``."""
    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r} (known: {', '.join(DTYPES)})")
    if requested != "auto":
        return requested
    kind = getattr(device, "type", str(device).split(":")[0])
    native = (
        cuda_native_bf16(device if kind == "cuda" and not isinstance(device, str) else None)
        if kind == "cuda"
        else cpu_native_bf16()
        if kind == "cpu"
        else False
    )
    return "bf16" if native else "fp32"


def planned_dtype(requested: str, cuda: bool) -> str:
    """The dtype the planner sizes a job for: ``auto`` on the GPUs it plans for is bf16."""
    return "bf16" if requested == "bf16" or (requested == "auto" and cuda) else "fp32"


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


if __name__ == "__main__":  # python -m ar2dlm.core.precision: which CPU class this machine is, what auto picks
    from ..provenance import machine

    facts = machine()
    print(
        f"CPU: {facts['cpu']}; torch kernels: {facts['kernels']}; bf16 instructions: "
        f"{', '.join(facts['bf16_instructions']) or 'none'}; CUDA: {facts['cuda'] or 'none'}"
    )
    print(
        f"dtype: auto resolves to {resolve_dtype('auto', 'cpu')} on the CPU"
        + (f" and {resolve_dtype('auto', 'cuda')} on the GPU" if facts["cuda"] else "")
    )
