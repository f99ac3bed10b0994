"""Each process owns its GPU before any CUDA work and every collective runs on it: proved on CPU
under a strict fake of CUDA and NCCL (gloo on CPU accepts what NCCL on GPUs refuses, so the
two-process tests in test_trainer.py alone cannot show it).

The fake records every CUDA call; a tensor "on a GPU" is a CPU tensor that reports the GPU as its
device (results of operations on it stay there, and mixing it with a CPU tensor fails as on CUDA);
every collective refuses a tensor that is not on the GPU its communicator is bound to, with the
error NCCL gives."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.utils._device import _device_constructors
from torch.utils._pytree import tree_flatten, tree_map

from ar2dlm.core.precision import resolve_dtype
from ar2dlm.training import distributed, sharding
from ar2dlm.training.distributed import ProcessGroup, process_group

LOCAL_RANK, WORLD = 1, 2
_REAL_TO = torch.Tensor.to


class OnGPU(torch.Tensor):
    """A CPU tensor standing for one on ``gpu``."""

    @staticmethod
    def of(data: torch.Tensor, gpu) -> "OnGPU":
        out = data.as_subclass(OnGPU)
        out.gpu = torch.device(gpu)
        return out

    @property
    def device(self):
        return self.gpu

    def plain(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        leaves, _ = tree_flatten((args, kwargs or {}))
        gpus = {a.gpu for a in leaves if isinstance(a, OnGPU)}
        if len(gpus) > 1 or any(type(a) is torch.Tensor and a.dim() > 0 for a in leaves):  # CUDA takes CPU scalars only
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices "
                f"({', '.join(map(str, gpus))} and cpu) in {getattr(func, '__name__', func)}"
            )
        args, kwargs = tree_map(lambda a: a.plain() if isinstance(a, OnGPU) else a, (args, kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in (torch.Tensor.cpu, torch.Tensor.numpy):
            return out
        gpu = next(iter(gpus))
        return tree_map(lambda o: OnGPU.of(o, gpu) if type(o) is torch.Tensor else o, out)


class StrictNCCL:
    """What the fake saw: ``calls`` in order; the device set, the one the group is bound to."""

    def __init__(self):
        self.calls, self.current, self.bound, self.initialized = [], None, None, False

    def cuda(self, *call):
        self.calls.append(call)

    def on_bound_gpu(self, name, tensor):
        """NCCL's refusal of a tensor off the communicator's GPU."""
        self.calls.append((name, str(tensor.device)))
        if not self.initialized:
            raise RuntimeError(f"{name}: Default process group has not been initialized")
        if not isinstance(tensor, OnGPU):
            raise RuntimeError(f"{name}: No backend type associated with device type {tensor.device.type}")
        if tensor.device != self.bound:
            raise RuntimeError(f"{name}: tensor on {tensor.device}, the communicator is bound to {self.bound}")

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def strict_nccl(monkeypatch):
    """Rank 1 of 2 on a node with GPUs, under torchrun with NCCL (faked)."""
    fake = StrictNCCL()
    from ar2dlm.core import models

    monkeypatch.setattr(models, "triton_problem", lambda: None)  # the faked node can build Triton kernels
    for key, value in {"WORLD_SIZE": WORLD, "RANK": LOCAL_RANK, "LOCAL_RANK": LOCAL_RANK}.items():
        monkeypatch.setenv(key, str(value))

    def set_device(d):
        fake.cuda("set_device", str(torch.device(d)))
        fake.current = torch.device(d)

    def capability(d=None):
        fake.cuda("capability", str(d))
        return 9, 0

    cuda = {
        "is_available": lambda: True,
        "device_count": lambda: 8,
        "set_device": set_device,
        "current_device": lambda: fake.cuda("current_device") or (fake.current or torch.device("cuda:0")).index,
        "get_device_capability": capability,
        "synchronize": lambda d=None: fake.cuda("synchronize", str(d)),
        "max_memory_allocated": lambda d=None: fake.cuda("max_memory_allocated", str(d)) or 3e9,
        "max_memory_reserved": lambda d=None: fake.cuda("max_memory_reserved", str(d)) or 4e9,
    }
    for name, f in cuda.items():
        monkeypatch.setattr(torch.cuda, name, f)

    def on_cuda(device) -> bool:
        return device is not None and torch.device(device).type == "cuda"

    def creator(real):
        def create(*args, device=None, **kwargs):
            if not on_cuda(device):
                return real(*args, device=device, **kwargs)
            fake.cuda("alloc", str(torch.device(device)))
            return OnGPU.of(real(*args, **kwargs), device)

        return create

    # ``with torch.device(...)`` (transformers loads models under ``torch.device("meta")``) matches
    # calls against a set of torch's constructors cached once per process: fill that cache with the
    # real constructors before faking them, else it keeps the fakes and every later meta-device load
    # in this process builds on CPU and leaves its rotary buffers uninitialised.
    constructors = _device_constructors()
    real = {name: getattr(torch, name) for name in ("tensor", "zeros", "ones", "full", "empty", "arange")}
    assert set(real.values()) <= constructors
    for name, f in real.items():
        monkeypatch.setattr(torch, name, creator(f))

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        data = self.plain() if isinstance(self, OnGPU) else self
        moved = _REAL_TO(data, dtype=dtype) if dtype is not None else data
        if on_cuda(device):
            if not isinstance(self, OnGPU) or self.gpu != torch.device(device):
                fake.cuda("to", str(torch.device(device)))
            return OnGPU.of(moved, device)
        if isinstance(self, OnGPU) and device is None:
            return OnGPU.of(moved, self.gpu)
        return moved

    monkeypatch.setattr(torch.Tensor, "to", to)

    def init_process_group(backend, device_id=None, timeout=None, **kw):
        fake.calls.append(("init", backend, str(device_id), timeout))
        if backend != "nccl" or device_id is None or torch.device(device_id) != fake.current:
            raise RuntimeError(
                f"the NCCL group must be bound to the device set before it (set: {fake.current}, "
                f"bound: {device_id}, backend {backend})"
            )
        fake.bound, fake.initialized = torch.device(device_id), True

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        fake.on_bound_gpu("all_reduce", tensor)
        if op == dist.ReduceOp.SUM:  # the other rank holds the same values
            tensor.plain().mul_(WORLD)

    def barrier(group=None, async_op=False, device_ids=None, timeout=None):
        fake.calls.append(("barrier", device_ids))
        if not fake.initialized or (device_ids is not None and device_ids != [fake.bound.index]):
            raise RuntimeError(f"barrier on {device_ids}, the communicator is bound to {fake.bound}")

    def all_gather_object(out, obj, group=None):  # NCCL sends the pickled object from the current device
        fake.on_bound_gpu("all_gather_object", OnGPU.of(torch.empty(0), fake.current or "cuda:0"))
        out[:] = [obj] * len(out)

    def broadcast_object_list(objects, src=None, group=None, device=None, group_src=None):
        fake.on_bound_gpu("broadcast_object_list", OnGPU.of(torch.empty(0), device or fake.current or "cuda:0"))

    def destroy_process_group(group=None):
        fake.calls.append(("destroy",))
        fake.initialized = False

    def init_device_mesh(device_type, shape, **kw):
        fake.calls.append(("mesh", device_type, tuple(shape)))
        if device_type != "cuda" or not fake.initialized:
            raise RuntimeError(f"device mesh of {device_type} before the NCCL group")
        return ("mesh", device_type, tuple(shape))

    for name, f in {
        "is_initialized": lambda: fake.initialized,
        "init_process_group": init_process_group,
        "all_reduce": all_reduce,
        "barrier": barrier,
        "all_gather_object": all_gather_object,
        "broadcast_object_list": broadcast_object_list,
        "destroy_process_group": destroy_process_group,
    }.items():
        monkeypatch.setattr(dist, name, f)
    monkeypatch.setattr(torch.distributed.device_mesh, "init_device_mesh", init_device_mesh)
    yield fake
    assert _device_constructors() is constructors, "the fake's constructors leaked into torch's device-context cache"


def assert_device_set_first(fake: StrictNCCL):
    """set_device before the process group and before any CUDA allocation or move."""
    kinds = fake.kinds()
    first = kinds.index("set_device")
    assert fake.calls[first] == ("set_device", f"cuda:{LOCAL_RANK}")
    cuda_work = [i for i, k in enumerate(kinds) if k in ("alloc", "to", "init", "mesh", "capability")]
    assert all(i > first for i in cuda_work), fake.calls


def test_the_fake_refuses_what_nccl_refuses(strict_nccl):
    """The fake can fail: a CPU tensor, a tensor on another GPU, a group not bound to the device set."""
    with pytest.raises(RuntimeError, match="not been initialized"):
        dist.all_reduce(torch.tensor([1.0], device=f"cuda:{LOCAL_RANK}"))
    with pytest.raises(RuntimeError, match="bound to the device set before it"):
        dist.init_process_group("nccl", device_id=torch.device(f"cuda:{LOCAL_RANK}"))  # set_device never called
    torch.cuda.set_device(torch.device(f"cuda:{LOCAL_RANK}"))
    dist.init_process_group("nccl", device_id=torch.device(f"cuda:{LOCAL_RANK}"), timeout=timedelta(minutes=1))
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.tensor([1.0]))  # what segment_ends all-reduced before
    with pytest.raises(RuntimeError, match="bound to cuda:1"):
        dist.all_reduce(torch.tensor([1.0], device="cuda:0"))
    with pytest.raises(RuntimeError, match="same device"):
        torch.tensor([1.0, 2.0], device="cuda:1") + torch.tensor([1.0, 2.0])


class _Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
        self.lm_head = torch.nn.Linear(2, 2)


def test_each_rank_owns_its_gpu_before_any_cuda_work(strict_nccl, monkeypatch):
    """The device is set from LOCAL_RANK first, the NCCL group is bound to it with an explicit
    timeout, ``auto`` resolves on that device (never GPU 0), FSDP2's mesh is explicit and on CUDA,
    and the group is destroyed at the end."""
    import torch.distributed.fsdp as fsdp

    placed = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: placed.append(kw.get("mesh")))
    with process_group() as pg:
        assert pg == ProcessGroup(WORLD, LOCAL_RANK, torch.device(f"cuda:{LOCAL_RANK}")) and pg.backend == "nccl"
        assert resolve_dtype("auto", pg.device) == "bf16"
        sharding.shard(_Decoder(), "bf16", sharding.device_mesh(pg))
    assert placed == [("mesh", "cuda", (WORLD,))] * 3  # each layer and the root on the explicit mesh
    init = next(c for c in strict_nccl.calls if c[0] == "init")
    assert init == ("init", "nccl", f"cuda:{LOCAL_RANK}", distributed.COLLECTIVE_TIMEOUT)
    assert ("capability", f"cuda:{LOCAL_RANK}") in strict_nccl.calls
    assert strict_nccl.kinds()[-1] == "destroy"
    assert_device_set_first(strict_nccl)


def test_the_process_group_is_destroyed_on_an_exception_by_the_block_that_started_it(strict_nccl):
    with pytest.raises(KeyError):
        with process_group():
            with process_group():  # a nested block uses its caller's group
                pass
            assert "destroy" not in strict_nccl.kinds()
            raise KeyError("a failed step")
    assert strict_nccl.kinds().count("destroy") == 1 and not dist.is_initialized()


def test_every_collective_of_the_loop_runs_on_the_ranks_gpu(strict_nccl):
    """The loop's finite check, loss values, FLOP sums, segment end and barrier; the checkpoints'
    object gathers; the objectives' whole-batch counts: each on cuda:LOCAL_RANK (two ranks holding
    the same values, so sums double and means stay)."""
    import time

    from ar2dlm.training.objectives.distillation import whole_batch_count

    with process_group() as pg:
        gpu = pg.device
        assert distributed.all_finite(torch.tensor(2.5, device=gpu), pg)
        assert not distributed.all_finite(torch.tensor(float("nan"), device=gpu), pg)
        terms = {"diffusion": torch.tensor(1.5, device=gpu), "align": torch.tensor(0.25, device=gpu)}
        assert distributed.whole_batch_values(terms, pg) == {"diffusion": 1.5, "align": 0.25}
        assert distributed.summed([1.0, 2.0, 0.0], pg) == [2.0, 4.0, 0.0]
        assert not distributed.segment_ends(time.time(), 10.0, 1.0, pg)
        assert distributed.segment_ends(time.time() - 3590, 10.0, 1.0, pg)
        distributed.barrier(pg)
        assert distributed.all_gathered({"a": 1}, pg) == [{"a": 1}] * WORLD
        assert distributed.from_main([3], pg) == [3]
        assert int(whole_batch_count(torch.ones(3, device=gpu), WORLD)) == 3 * WORLD
        # the step's peak memory, the largest over the ranks (both ranks hold the same)
        assert distributed.peak_memory(pg) == {"peak_allocated_gb": 3.0, "peak_reserved_gb": 4.0}
        assert ("max_memory_allocated", f"cuda:{LOCAL_RANK}") in strict_nccl.calls
    collectives = [c for c in strict_nccl.calls if c[0] in ("all_reduce", "all_gather_object", "broadcast_object_list")]
    assert len(collectives) == 10 and all(c[1] == f"cuda:{LOCAL_RANK}" for c in collectives)
    assert ("barrier", [LOCAL_RANK]) in strict_nccl.calls
    assert_device_set_first(strict_nccl)


def test_train_run_sets_the_device_before_it_moves_any_model(strict_nccl, smoke_tokenizer, tmp_path, monkeypatch):
    """The trainer's first CUDA work (the frozen teacher's move to its GPU) comes after the device
    is set and the group bound; the group is destroyed when the run fails."""
    from ar2dlm.core.models import build_qwen3, save_model
    from ar2dlm.pipeline.config import merge_preset
    from ar2dlm.pipeline.resolved import resolve
    from ar2dlm.provenance import write_jsonl
    from ar2dlm.training.teacher import ar_conventions
    from ar2dlm.training.trainer import train_run
    from tests.conftest import REPO
    from tests.shared import TINY_ARCH, smoke_job

    class FirstMove(Exception):
        pass

    real_to = torch.nn.Module.to

    def module_to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is None or device.type != "cuda":
            return real_to(self, *args, **kwargs)
        strict_nccl.cuda("module.to", str(device))
        raise FirstMove

    tok, docs = smoke_tokenizer
    save_model(build_qwen3(TINY_ARCH, tok), tok, tmp_path / "teacher", {**ar_conventions(tok), "method": "test"})
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    run = resolve(merge_preset({"preset": "smoke"}, REPO / "config")).run("ra").as_dict()
    run["training"].update({"batch_size": 8, "grad_accum": 1, "seq_len": 64, "dtype": "auto"})
    monkeypatch.setattr(torch.nn.Module, "to", module_to)
    with pytest.raises(FirstMove):
        train_run(smoke_job(tmp_path, run, tmp_path / "out"))
    kinds = strict_nccl.kinds()
    assert kinds.index("set_device") < kinds.index("init") < kinds.index("module.to") < kinds.index("destroy")
    assert ("module.to", f"cuda:{LOCAL_RANK}") in strict_nccl.calls
    assert_device_set_first(strict_nccl)


def test_a_process_without_the_gpu_its_job_was_given_stops_naming_both(monkeypatch):
    """No silent fall back to the CPU (gloo, emulated bf16): a job granted GPUs by SLURM or named CUDA
    devices, or a SLURM job its plan launches on GPUs, that sees none stops before any work, as does a
    node with more torchrun processes than GPUs; a CPU job with none of these runs on the CPU."""
    from ar2dlm.core.models import device_problem, resolve_device

    assert "SLURM granted this job 4 GPU(s)" in device_problem(0, {"SLURM_GPUS_ON_NODE": "4"}, visible=0)
    assert "SLURM granted this job 2 GPU(s)" in device_problem(0, {"SLURM_JOB_GPUS": "0,1"}, visible=0)
    assert "the plan launches this run on 8 GPU(s)" in device_problem(8, {"SLURM_JOB_ID": "7"}, visible=0)
    assert device_problem(8, {}, visible=0) is None  # a plan rehearsed on CPU ranks outside SLURM (stand-ins)
    assert "given CUDA devices '0,1'" in device_problem(0, {"CUDA_VISIBLE_DEVICES": "0,1"}, visible=0)
    assert device_problem(0, {"CUDA_VISIBLE_DEVICES": ""}, visible=0) is None  # hidden on purpose
    crowded = device_problem(0, {"LOCAL_WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, visible=4)
    assert "torchrun starts 8 processes on this node" in crowded and "sees 4 CUDA device(s)" in crowded
    assert "CUDA_VISIBLE_DEVICES='0,1,2,3'" in crowded
    assert device_problem(0, {"LOCAL_WORLD_SIZE": "2"}, visible=0) is None  # CPU ranks under gloo: by choice
    assert device_problem(8, {"LOCAL_WORLD_SIZE": "8", "SLURM_GPUS_ON_NODE": "8"}, visible=8) is None
    if torch.cuda.is_available():
        return  # the rest needs a machine without CUDA
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "1")
    with pytest.raises(RuntimeError, match=r"no GPU for this job: SLURM granted this job 1 GPU\(s\)"):
        resolve_device("auto")  # an evaluation or AR-MAP job
    with pytest.raises(RuntimeError, match=r"no GPU for this process: SLURM granted"):
        with process_group():  # a training job's ranks
            pass
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")
    assert resolve_device("auto").type == "cpu"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    with pytest.raises(RuntimeError, match=r"the plan launches this run on 2 GPU\(s\)"):
        with process_group(planned_gpus=2):
            pass
    assert not dist.is_initialized()


@pytest.mark.parametrize("head", [False, True])
def test_a_sharded_teacher_is_resharded_after_its_forward(head):
    """FSDP2 keeps a root unit gathered after its forward for the backward that would reshard it; a
    frozen teacher has none, and without its head every layer is a root. Sharded as frozen, every
    parameter is back to its shard after the teacher's forward (traced on 2 fake ranks)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from transformers import AutoModel, AutoModelForCausalLM, Qwen3Config

    from ar2dlm.plan.trace import fake_process_group

    cfg = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    ids = torch.randint(0, 64, (2, 8))
    gathered = {}
    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (2,))
        for frozen in (False, True):
            teacher = (AutoModelForCausalLM if head else AutoModel).from_config(cfg).requires_grad_(False)
            sharding.shard(teacher, "fp32", mesh, frozen=frozen)
            whole = {n for n, p in teacher.named_parameters() if not isinstance(p, DTensor)}  # no unit's (final norm)
            with torch.no_grad():
                teacher(input_ids=ids)
            gathered[frozen] = [
                n for n, p in teacher.named_parameters() if not isinstance(p, DTensor) and n not in whole
            ]
    assert gathered[False]  # the unfrozen sharding leaves the roots gathered
    assert gathered[True] == []


@pytest.mark.parametrize("code, want", [(75, 75), (3, 1), (0, 0)])
def test_the_launcher_passes_a_segments_exit_status_75_through_two_processes(tmp_path, code, want):
    """Two CPU ranks under ``ar2dlm.training.torchrun`` (what a multi-GPU job's launcher starts): each
    stopping with 75 (a segment ended) ends the job with 75, where torchrun itself exits 1; another
    failure stays torchrun's 1."""
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(f"import sys\nsys.exit({code})\n")
    cmd = [sys.executable, "-m", "ar2dlm.training.torchrun", "--standalone", "--nproc_per_node=2", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == want, proc.stderr[-3000:]


def test_a_rendezvous_host_that_does_not_resolve_stops_the_launcher_before_any_process(capsys):
    from ar2dlm.training.torchrun import main, rendezvous_problem

    assert rendezvous_problem(["--nnodes=2", "--rdzv_endpoint=localhost:29500", "x.py"]) is None
    assert rendezvous_problem(["--standalone", "x.py"]) is None
    argv = ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=no-such-node.invalid:29500", "x.py"]
    assert main(argv) == 2
    assert "the rendezvous host 'no-such-node.invalid' (--rdzv_endpoint=no-such-node.invalid:29500)" in (
        capsys.readouterr().err
    )


def test_a_gpu_job_without_what_triton_needs_stops_naming_it(monkeypatch):
    """Triton (flex attention, torch.compile on a GPU) compiles with a C compiler and links libcuda: a job
    bound for CUDA without either stops before any work, naming it; a CPU job does not ask."""
    from ar2dlm.core import models
    from ar2dlm.core.models import triton_problem

    def which(known):
        return lambda name: f"/usr/bin/{name}" if name in known else None

    def library(found):
        return lambda name: "libcuda.so.1" if found else None

    assert triton_problem({}, which({"gcc"}), library(True)) is None
    assert "no C compiler (cc, gcc or clang)" in triton_problem({}, which(set()), library(True))
    assert "no C compiler (CC='icx')" in triton_problem({"CC": "icx"}, which({"gcc"}), library(True))
    assert "libcuda.so" in triton_problem({}, which({"cc"}), library(False))
    assert triton_problem({"TRITON_LIBCUDA_PATH": "/opt/cuda"}, which({"cc"}), library(False)) is None
    monkeypatch.setattr(models, "triton_problem", lambda: "Triton cannot build kernels here: no C compiler")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="Triton cannot build kernels here"):
        models.resolve_device("cuda")
    models.require_triton(torch.device("cpu"))  # nothing asked of a CPU job
