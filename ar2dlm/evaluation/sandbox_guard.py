"""The sandboxes' guard: one process per evaluator, started with the first sandbox, that outlives
the evaluator and ends every sandbox it left behind. Standard library only; it runs as
``python -I -S -c <this file's text>`` in a session of its own (a signal to the evaluator's
process group does not reach it).

The parent-death signal does not carry the chain of a root evaluator's sandbox: the inner
bubblewrap launcher, started as ``nobody`` under the outer one, survives the outer launcher's death
(measured with bubblewrap 0.8), so an evaluator killed with SIGKILL would leave the launcher, the
namespace's init and the program running for good. The evaluator instead tells the guard, over a
pipe, each sandbox's processes as it starts (``+ PID...``, the outer launcher first: it leads the
sandbox's process group) and ends it (``- PID``); when the pipe closes, however the evaluator
ended, the guard sends SIGKILL to the process group of every sandbox still listed (the inner
launcher is in it even once the outer one has died; the namespace's init dies with it) and to its
listed processes, and exits.
"""

import os
import signal
import sys


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    live = {}
    for line in sys.stdin:
        op, *pids = line.split()
        if op == "+" and pids:
            live[pids[0]] = [int(p) for p in pids]
        elif op == "-" and pids:
            live.pop(pids[0], None)
    for pids in live.values():
        for kill, pid in [(os.killpg, pids[0])] + [(os.kill, p) for p in reversed(pids)]:
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


if __name__ == "__main__":
    main()
