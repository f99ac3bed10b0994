"""The untrusted side of the code sandbox: loads one generated program and answers calls to its
entry point with plain data. Standard library only: it runs as ``python -I -c <this file's text>``
inside the bubblewrap sandbox (``ar2dlm.evaluation.sandbox``), which sees neither this package nor
the problems, the canonical solutions or the expected outputs.

Protocol: one JSON document per line. Parent -> runner: first ``{"program", "entry_point",
"limits", "path"}``, then ``{"call": [args...]}`` per test input. Runner -> parent: ``{"ready": true}``
once the program is loaded, then ``{"ok": value}`` or ``{"raised": name}`` per call. Values travel
in the plain-data encoding below; the parent decodes replies with ``decode``, which builds exact
builtin types only and bounds depth, so nothing the program returns can carry behaviour (an
``__eq__`` that is always true) back to the side that computes the verdict.

Plain data: ``None``, ``bool``, ``int``, ``float``, ``str`` and lists as JSON; tuples, sets,
frozensets, dicts, bytes and complex numbers as one-key objects ``{"tuple": [...]}``,
``{"set": [...]}``, ``{"frozenset": [...]}``, ``{"dict": [[k, v], ...]}``, ``{"bytes": hex}``,
``{"complex": [re, im]}``.
"""

import json
import os
import resource
import sys

MAX_DEPTH = 100
_TAGS = ("tuple", "set", "frozenset", "dict", "bytes", "complex")


def encode(x, depth=0):
    """``x`` as JSON-ready plain data. Subclasses of builtins are read through the builtin's own
    methods (a ``Counter`` travels as its dict, an ``IntEnum`` as its int, a ``str`` subclass as
    its characters); numpy scalars as their Python value; anything else raises TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deep")
    d = depth + 1
    if x is None or type(x) is bool:
        return x
    if isinstance(x, int):
        return int.__int__(x)
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, complex):
        return {"complex": [complex.__complex__(x).real, complex.__complex__(x).imag]}
    if isinstance(x, (bytes, bytearray)):
        return {"bytes": bytes(x).hex()}
    if isinstance(x, list):
        return [encode(v, d) for v in list.__iter__(x)]
    if isinstance(x, tuple):
        return {"tuple": [encode(v, d) for v in tuple.__iter__(x)]}
    if isinstance(x, dict):
        return {"dict": [[encode(k, d), encode(v, d)] for k, v in dict.items(x)]}
    if isinstance(x, frozenset):
        return {"frozenset": [encode(v, d) for v in frozenset.__iter__(x)]}
    if isinstance(x, set):
        return {"set": [encode(v, d) for v in set.__iter__(x)]}
    if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "shape", None) == ():
        return encode(x.item(), d)  # a numpy scalar, as evalplus's ``==`` would compare it
    raise TypeError(f"{type(x).__name__} is not plain data")


def decode(j, depth=0):
    """The value ``j`` (parsed JSON) encodes, built from exact builtin types only; ValueError on
    anything else."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deep")
    d = depth + 1
    if j is None or type(j) in (bool, int, float, str):
        return j
    if type(j) is list:
        return [decode(v, d) for v in j]
    if type(j) is not dict or len(j) != 1:
        raise ValueError("not plain data")
    ((tag, v),) = j.items()
    if tag not in _TAGS:
        raise ValueError(f"unknown tag {tag!r}")
    if tag == "bytes":
        if type(v) is not str:
            raise ValueError("bytes must be hex")
        return bytes.fromhex(v)
    if type(v) is not list:
        raise ValueError(f"{tag} must hold a list")
    if tag == "complex":
        if len(v) != 2 or not all(type(p) in (int, float) for p in v):
            raise ValueError("complex must be [re, im]")
        return complex(v[0], v[1])
    if tag == "dict":
        if not all(type(p) is list and len(p) == 2 for p in v):
            raise ValueError("dict must hold [key, value] pairs")
        return {decode(k, d): decode(val, d) for k, val in v}
    items = [decode(x, d) for x in v]
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)


# -- the runner -------------------------------------------------------------------------------

_DENIED = (
    "os.system",
    "os.fork",
    "os.forkpty",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "os.setuid",
    "os.chroot",
    "ctypes.dlsym",
    "ctypes.call_function",
    "socket.",
    "_posixsubprocess.",
)


def _second_layer(root):
    """An audit hook (it cannot be removed once added) refusing process creation, signals, native
    calls, sockets and writes outside ``root``. A second layer only: the boundary is the sandbox."""

    def hook(event, args):
        if event.startswith(_DENIED) or (event == "ctypes.dlopen" and args[0] is not None):
            raise PermissionError(f"sandbox: {event} is not allowed")  # ctypes itself opens the process (None)
        if event == "open" and args[0] is not None and not isinstance(args[0], int):
            mode, flags = args[1], args[2] or 0
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or flags & (
                os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            )
            path = os.fsdecode(args[0])
            if writes and not os.path.normpath(os.path.join(root, path)).startswith(root + os.sep):
                raise PermissionError(f"sandbox: writing {path!r} outside {root}")

    sys.addaudithook(hook)


def _limit(which, value):
    resource.setrlimit(which, (value, value))


def main():
    # The channel moves to private descriptors; the program's stdin, stdout and stderr become /dev/null.
    chan_in, chan_out = os.fdopen(os.dup(0), "rb"), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)

    def reply(obj):
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(chan_out, data) :]

    first = json.loads(chan_in.readline())
    sys.path[:] = first["path"]
    limits = first["limits"]
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _limit(resource.RLIMIT_CPU, limits["cpu_s"])
    _limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _limit(resource.RLIMIT_NPROC, limits["processes"])
    _limit(resource.RLIMIT_NOFILE, limits["open_files"])
    _limit(resource.RLIMIT_CORE, 0)
    sys.setrecursionlimit(limits.get("recursion", 10000))
    _second_layer(os.getcwd())
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(first["program"], "<program>", "exec"), namespace)
        fn = namespace[first["entry_point"]]
    except BaseException as e:  # noqa: B036 - SystemExit and the like are the program's failure too
        reply({"raised": type(e).__name__})
        return
    reply({"ready": True})
    for line in chan_in:
        args = decode(json.loads(line)["call"])
        try:
            out = {"ok": encode(fn(*args))}
        except BaseException as e:  # noqa: B036
            out = {"raised": type(e).__name__}
        reply(out)


if __name__ == "__main__":
    main()
