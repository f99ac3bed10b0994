"""Every sandbox ends with its verdict, and none outlives the evaluator, however its program blocks."""

import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from ar2dlm.evaluation.code import CodeScoring, score_samples
from ar2dlm.provenance import write_jsonl
from tests.test_sandbox import HONEST, TOY

BLOCKING = {
    "sleep": "    import time\n    time.sleep(10 ** 6)\n",
    "event_wait": "    import threading\n    threading.Event().wait()\n",
    "select_nothing": "    import select\n    select.select([], [], [])\n",
    "socket_accept": "    import socket\n    s = socket.socket()\n    s.bind(('127.0.0.1', 0))\n"
    "    s.listen()\n    s.accept()\n",
    "child_sleeps": "    import _posixsubprocess, os\n    r, w = os.pipe()\n"
    "    _posixsubprocess.fork_exec([b'/bin/sleep', b'100000'], [b'/bin/sleep'], True, (), None, None,"
    " -1, -1, -1, -1, -1, -1, r, w, True, False, 0, None, None, None, -1, None, False)\n"
    "    import time\n    time.sleep(10 ** 6)\n",
    "thread_after_reply": "    import threading, time\n"
    "    threading.Thread(target=time.sleep, args=(10 ** 6,)).start()\n"
    "    return x * x + 7\n",
}


def _is_guard(p: psutil.Process) -> bool:
    try:
        return "The sandboxes' guard" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _named(p: psutil.Process, name: str) -> bool:
    try:
        return p.name() == name
    except psutil.Error:  # it exited while read
        return False


def _lives(p: psutil.Process) -> bool:
    """Whether ``p`` runs and is not a zombie; a process may exit between the two reads."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Watch:
    """Every process that descends from ``root`` while the watch runs (polled every 5 ms), the
    evaluator's guard aside."""

    def __init__(self, root: int):
        self.root, self.seen, self.stop = psutil.Process(root), {}, False
        self.before = {p.pid for p in self.root.children(recursive=True)}
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self.stop:
            try:
                for p in self.root.children(recursive=True):
                    if p.pid not in self.before and p.pid not in self.seen and not _is_guard(p):
                        self.seen[p.pid] = p
            except psutil.Error:
                pass
            time.sleep(0.005)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()

    def running(self, name: str) -> int:
        """How many seen processes called ``name`` still run."""
        return sum(_lives(p) and _named(p, name) for p in list(self.seen.values()))

    def alive(self) -> list[str]:
        out = []
        for p in list(self.seen.values()):  # the watch may still be adding to it
            try:  # the guard is read again: a poll between its fork and its exec saw pytest's command line
                if _lives(p) and not _is_guard(p):
                    out.append(f"{p.pid} {p.username()} {' '.join(p.cmdline())[:80]}")
            except psutil.Error:
                pass
        return out


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("lifetime") / "toy.jsonl"
    write_jsonl(path, [TOY])
    return path


@pytest.mark.parametrize("kind", list(BLOCKING))
def test_a_blocked_program_leaves_no_process_once_scored(toy, kind):
    for fmt in ("evalplus", "humaneval"):
        with Watch(psutil.Process().pid) as watch:
            scored = score_samples(
                toy,
                [{"task_id": "Toy/0", "completion": BLOCKING[kind]}, {"task_id": "Toy/0", "completion": HONEST}],
                CodeScoring(fmt=fmt, test_timeout_s=2.0),
            )
            left = watch.alive()  # read before the watch stops: scoring has returned
        blocked, honest = scored["per_task"]["Toy/0"]
        assert honest["base"] and blocked["base"] == (kind == "thread_after_reply"), (kind, fmt)
        # the blocked sandbox's layers (outer bwrap, the namespace's bwrap, the program); the honest
        # sandbox's may come and go between two polls on a loaded machine
        assert len(watch.seen) >= 3, f"the watch saw only {len(watch.seen)} processes"
        assert left == [], f"{kind} on the {fmt} route left {left}"


EVALUATOR = """
import sys
from ar2dlm.evaluation.code import CodeScoring, score_samples
body = "    import time\\n    time.sleep(10 ** 6)\\n"
score_samples(sys.argv[1], [{"task_id": "Toy/0", "completion": body}] * 8,
              CodeScoring(fmt=sys.argv[2], parallel=2, test_timeout_s=600.0))
"""


@pytest.mark.parametrize("fmt", ["evalplus", "humaneval"])
def test_no_sandbox_outlives_an_evaluator_killed_mid_scoring(toy, fmt):
    evaluator = subprocess.Popen([sys.executable, "-c", EVALUATOR, str(toy), fmt])
    with Watch(evaluator.pid) as watch:
        deadline = time.monotonic() + 60
        while watch.running("bwrap") < 4:
            assert time.monotonic() < deadline and evaluator.poll() is None, "no two sandboxes started"
            time.sleep(0.05)
        time.sleep(0.5)  # the programs are asleep
        guard = [p for p in psutil.Process(evaluator.pid).children() if _is_guard(p)]
    evaluator.send_signal(signal.SIGKILL)
    evaluator.wait()
    # the guard sees its parent die and ends the sandboxes: polled until every one has gone, to a deadline
    deadline = time.monotonic() + 60
    while (watch.alive() or any(map(_lives, guard))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watch.alive() == [], f"left 60 s after the evaluator's SIGKILL: {watch.alive()}"
    assert len(guard) == 1 and not _lives(guard[0])
