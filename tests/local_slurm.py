"""A one-node SLURM cluster on localhost for the tests: munged, slurmctld and slurmd started from
Debian's ``slurm-wlm`` and ``munge`` packages with a generated configuration (accounting off, one
CPU partition), all files in one folder, every daemon stopped by PID.

Snakemake's SLURM job-step plugin removes every ``SLURM_*`` variable (``SLURM_CONF`` included)
before its inner ``srun``, so that ``srun`` reads the default ``/etc/slurm/slurm.conf``: the cluster
writes its configuration there too, only when no file is there (or only a stale one of its own, left by a
run that was killed before it stopped), and removes it when it stops."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
CLUSTER_NAME = "ar2dlm-test"  # marks a default configuration this module wrote
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def install() -> str | None:
    """Install the packages with apt when a binary is missing; returns why it cannot, or None."""
    if all(shutil.which(b) for b in BINARIES):
        return None
    if shutil.which("apt-get") is None:
        return "apt-get is not available on this machine"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        proc = subprocess.run(prefix + cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return f"{' '.join(cmd)} failed: {proc.stderr[-500:]}"
    return None


def _ours(conf: Path) -> bool:
    """Whether a configuration file is one this module wrote (a killed test run leaves it behind: its
    daemons died with it, and every start writes fresh ports and paths)."""
    return conf.read_text(errors="replace").startswith(f"ClusterName={CLUSTER_NAME}\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSlurm:
    def __init__(self, root: Path, cpus: int | None = None):
        """cpus: the CPUs the node advertises (default: this machine's); more than it has oversubscribes."""
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count()
        self.procs: list[subprocess.Popen] = []
        self.wrote_default = False
        self.env = dict(os.environ, SLURM_CONF=str(self.root / "slurm.conf"))

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "munge", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        mem = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        (r / "slurm.conf").write_text(f"""ClusterName={CLUSTER_NAME}
SlurmctldHost={self.host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdTimeout=60
MinJobAge=300
SlurmdParameters=config_overrides
NodeName={self.host} CPUs={self.cpus} RealMemory={mem} State=UNKNOWN
PartitionName=cpu Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
""")
        if DEFAULT_CONF.exists() and not _ours(DEFAULT_CONF):
            raise RuntimeError(f"{DEFAULT_CONF} exists (a real SLURM installation?): not touching it")
        DEFAULT_CONF.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(r / "slurm.conf", DEFAULT_CONF)
        self.wrote_default = True

    def start(self) -> LocalSlurm:
        self._write_config()
        r = self.root
        self.procs.append(
            subprocess.Popen(
                [
                    "munged",
                    "--foreground",
                    "--force",
                    f"--key-file={r}/munge/munge.key",
                    f"--socket={r}/munge/munge.socket",
                    f"--pid-file={r}/munge/munged.pid",
                    f"--log-file={r}/log/munged.log",
                    f"--seed-file={r}/munge/seed",
                ],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), "munged")
        self.procs.append(
            subprocess.Popen(
                ["slurmctld", "-D", "-i", "-f", str(r / "slurm.conf")],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        self.procs.append(
            subprocess.Popen(
                ["slurmd", "-D", "-f", str(r / "slurm.conf")],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        self._wait(self._idle, "an idle SLURM node", timeout=60)
        return self

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
        return "idle" in out

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        t0 = time.time()
        while not ready():
            if time.time() - t0 > timeout or any(p.poll() is not None for p in self.procs):
                logs = "\n".join(p.read_text()[-800:] for p in (self.root / "log").glob("*.log"))
                self.stop()
                raise RuntimeError(f"the local SLURM cluster did not start ({what}):\n{logs}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.procs:
            subprocess.run(["scancel", "--user", str(os.getuid())], env=self.env, capture_output=True)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.procs.clear()
        if self.wrote_default:
            DEFAULT_CONF.unlink(missing_ok=True)
            self.wrote_default = False
