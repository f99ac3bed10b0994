"""torchrun, with what a job needs of it and torchrun leaves out (what ``plan.launch.launcher`` starts
for several processes):

- before any process starts, the c10d rendezvous host resolves on this node: otherwise each node's
  torchrun waits out its rendezvous timeout and fails minutes later with a connection error;
- a run planned in segments stops after a checkpoint with exit status 75 (``SEGMENT_DONE``) in each
  process, and the job then ends with 75, as a one-process job does, where torchrun reports any
  worker's failure as its own exit status 1.

    python -m ar2dlm.training.torchrun [torchrun's options] -m ar2dlm.training.convert_run ...
"""

from __future__ import annotations

import socket
import sys

SEGMENT_DONE = 75  # EX_TEMPFAIL: a segment of a run planned in several ended


def rendezvous_problem(argv: list[str], resolve=socket.getaddrinfo) -> str | None:
    """Why the host of ``--rdzv_endpoint=host:port`` in torchrun's ``argv`` cannot be reached by name here."""
    endpoint = next((a.split("=", 1)[1] for a in argv if a.startswith("--rdzv_endpoint=")), None)
    if not endpoint:
        return None
    host = (endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint).strip("[]")  # [::1]:29500 too
    if not host:
        return f"--rdzv_endpoint={endpoint} names no host (the job's first node: scontrol show hostnames)"
    try:
        resolve(host, None)
    except OSError as exc:
        here = socket.gethostname()
        return f"the rendezvous host {host!r} (--rdzv_endpoint={endpoint}) does not resolve on {here}: {exc}"
    return None


def exit_status(failures: dict) -> int:
    """The job's exit status for the failed processes torchrun reports (local rank -> failure): 75 when
    every one of them stopped with 75 (a segment ended), else 1, torchrun's own."""
    codes = {f.exitcode for f in failures.values()}
    return SEGMENT_DONE if codes == {SEGMENT_DONE} else 1


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = sys.argv[1:] if argv is None else argv
    if problem := rendezvous_problem(argv):
        print(f"ar2dlm.training.torchrun: {problem}", file=sys.stderr)
        return 2
    try:
        torch_run.main(argv)
    except ChildFailedError as exc:
        status = exit_status(exc.failures)
        if status != SEGMENT_DONE:
            raise
        print(f"ar2dlm.training.torchrun: every failed process stopped with {SEGMENT_DONE} (a segment ended)")
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
