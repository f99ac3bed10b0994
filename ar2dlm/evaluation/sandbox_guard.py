"""The sandboxes' guard: one process per evaluator, started with the first sandbox, that outlives
the evaluator and ends every sandbox it left behind. Standard library only; it runs as
``python -I -S -c <this file's text>`` in a session of its own (a signal to the evaluator's
process group does not reach it).

The parent-death signal does not carry the chain of a root evaluator's sandbox: the inner
bubblewrap launcher, started as ``nobody`` under the outer one, survives the outer launcher's death
(measured with bubblewrap 0.8), so an evaluator killed with SIGKILL would leave the launcher, the
namespace's init and the program running for good. The evaluator instead tells the guard, over a
pipe, each sandbox's processes as it starts (``+ PID...``) and ends it (``- PID``, the outer
launcher's pid first); when the pipe closes, however the evaluator ended, the guard sends SIGKILL
to every sandbox still listed (the namespace's init takes every process of the namespace with
it), and exits.
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
        for pid in reversed(pids):  # the namespace's init first, the outer launcher last
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


if __name__ == "__main__":
    main()
