import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake_command(args, workdir) -> list[str]:
    return SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(workdir)] + list(args)


def snakemake_env(hub_cache=None, **env) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", **env)
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    return env


def run_snakemake(args, workdir, timeout=600, hub_cache=None, **env):
    """Run snakemake on this repo's Snakefile with ``workdir`` as working directory (and the hub
    cache folder ``hub_cache``, e.g. the stand-in hub)."""
    return subprocess.run(
        snakemake_command(args, workdir),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=snakemake_env(hub_cache, **env),
    )


def planned_rules(dry_run_output: str) -> set[str]:
    """The rule names of the jobs a dry run lists (``rule NAME:`` headers), not substrings of paths."""
    return set(re.findall(r"^rule (\w+):", dry_run_output, re.M))


def planned_files(dry_run_output: str) -> set[str]:
    """Every output file of the jobs a dry run lists, whole paths (``output: a, b``)."""
    lines = re.findall(r"^\s+output: (.*)$", dry_run_output, re.M)
    return {path.strip() for line in lines for path in line.split(", ")}


@pytest.fixture(scope="session")
def standin_hub(tmp_path_factory):
    """A hub cache holding the paper preset's models and data sets as stand-ins (seconds)."""
    from ar2dlm.pipeline.standin_hub import write_paper_standin_hub

    cache = tmp_path_factory.mktemp("standin_hub")
    write_paper_standin_hub(cache)
    return cache


@pytest.fixture
def dry_run(tmp_path, standin_hub):
    """Dry-run all_tables with a config (a dict merged over a preset), the stand-in hub as the hub
    cache; returns the finished process."""

    def _run(
        config: dict | None = None, preset: str | None = "smoke", target: str = "all_tables", printshell: bool = False
    ):
        files = [str(REPO / "config" / "presets" / f"{preset}.yaml")] if preset else []
        if config is not None:
            path = tmp_path / "override.yaml"
            path.write_text(yaml.safe_dump(config))
            files.append(str(path))
        args = ["-n", target] + (["-p"] if printshell else []) + (["--configfile", *files] if files else [])
        return run_snakemake(args, tmp_path, timeout=120, hub_cache=standin_hub)

    return _run


class DryRun(NamedTuple):
    """A finished dry run: its exit status and output, and the modules its DAG build imported."""

    returncode: int
    stdout: str
    stderr: str
    imported: frozenset[str]


@pytest.fixture(scope="session")
def preset_dry_run(tmp_path_factory, standin_hub):
    """Dry-run all_tables on a preset as it ships (None: the embedded default), once per session for every
    test that reads it, under ``python -X importtime`` so that a test can see what the DAG build imports."""
    runs: dict[str | None, DryRun] = {}

    def _run(preset: str | None) -> DryRun:
        if preset not in runs:
            work = tmp_path_factory.mktemp(f"dry_{preset}")
            files = ["--configfile", str(REPO / "config" / "presets" / f"{preset}.yaml")] if preset else []
            command = [sys.executable, "-X", "importtime", *snakemake_command(["-n", "all_tables", *files], work)[1:]]
            proc = subprocess.run(
                command, cwd=work, capture_output=True, text=True, timeout=120, env=snakemake_env(standin_hub)
            )
            lines = proc.stderr.splitlines()
            imported = frozenset(line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:"))
            stderr = "\n".join(line for line in lines if not line.startswith("import time:"))
            runs[preset] = DryRun(proc.returncode, proc.stdout, stderr, imported)
        return runs[preset]

    return _run


@pytest.fixture(scope="session")
def smoke_tokenizer(tmp_path_factory):
    """A BPE tokenizer trained on a small synthetic corpus (seconds)."""
    from ar2dlm.data.code_suite import generate_code_suite
    from ar2dlm.data.corpus import suite_documents
    from ar2dlm.data.math_suite import generate_math_suite
    from ar2dlm.data.tokenization import train_bpe_tokenizer

    code, _, _ = generate_code_suite(300, 1, 0.2, 0)
    maths, _, _ = generate_math_suite(200, 1, 0)
    docs = suite_documents(code, maths)
    out = tmp_path_factory.mktemp("tok")
    return train_bpe_tokenizer((d["prompt"] + d["completion"] for d in docs), 400, out), docs


@pytest.fixture
def offline_hub(monkeypatch):
    """Make the Hugging Face hub unreachable for this test, whatever the machine's network."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


class BackgroundDag:
    """A snakemake run started in the background, outside this process's tree (tests that count their own
    descendants, such as the sandbox's, must not see its jobs): ``wait`` returns its working directory once
    it ends."""

    def __init__(self, group: int, workdir: Path, log: Path, rc: Path):
        self.group, self.workdir, self.log, self.rc, self.started = group, workdir, log, rc, time.time()

    def wait(self, timeout: float) -> Path:
        while not self.rc.exists():
            if time.time() > self.started + timeout:
                self.stop()
                pytest.fail(f"still running {timeout:.0f} s after it started: {self.log.read_text()[-3000:]}")
            time.sleep(5)
        assert self.rc.read_text().strip() == "0", self.log.read_text()[-6000:]
        return self.workdir

    def stop(self):
        try:  # snakemake and every job it started: their own process group
            os.killpg(self.group, signal.SIGTERM)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session", autouse=True)
def standin_dag(request, tmp_path_factory):
    """The paper_standin DAG (all_tables on the stand-in hub), started when a session that selects a
    paper_dag test begins, so that it runs beside the other tests instead of after them. It runs at the
    lowest CPU priority: it takes the cores the other tests leave idle (the second core beside a
    single-threaded test, the SLURM test's waits on its queue) and barely slows them, so no test's timeout
    changes meaning. The paper_dag tests wait for it; it is stopped at the session's end if still running.

    Its session's autogroup gets nice 19 as well as its processes: the kernel shares the CPU fairly between
    sessions whatever their processes' nice values (``sched_autogroup_enabled``), and a two-thread torch
    test whose second thread shares a core with this run waited at every parallel region's barrier: a
    fixture that trains in 6 s took 181 s beside one busy loop started with ``setsid nice -n 19``."""
    if not any(item.get_closest_marker("paper_dag") for item in request.session.items):
        yield None
        return
    import shlex

    from ar2dlm.data.standins import write_evalplus_release
    from ar2dlm.pipeline.layout import evalplus_cache

    hub = request.getfixturevalue("standin_hub")
    work = tmp_path_factory.mktemp("standin")
    write_evalplus_release(work / evalplus_cache())  # evalplus's download folder of this working directory
    args = ["all_tables", "--configfile", str(REPO / "config" / "presets" / "paper_standin.yaml"), "--cores", "2"]
    log, rc = work / "all_tables.log", work / "all_tables.rc"

    def q(path: Path) -> str:
        return shlex.quote(str(path))

    command = shlex.join(["nice", "-n", "19", *snakemake_command(args, work)])
    # The shell starts the run in a subshell and exits at once, so the run is reparented away from pytest.
    lowest = "(echo 19 > /proc/self/autogroup) 2>/dev/null;"  # the new session's autogroup, where the kernel has one
    shell = subprocess.Popen(
        ["sh", "-c", f"{lowest} ({command} > {q(log)} 2>&1; echo $? > {q(rc)}.part; mv {q(rc)}.part {q(rc)}) &"],
        cwd=work,
        env=snakemake_env(hub),
        start_new_session=True,
    )
    shell.wait()
    run = BackgroundDag(shell.pid, work, log, rc)
    yield run
    run.stop()


def pytest_terminal_summary(terminalreporter):
    """A skipped SLURM test is said in a banner at the end, not only as an ``s`` in the progress line."""
    for report in terminalreporter.stats.get("skipped", []):
        if "slurm" in report.keywords:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            terminalreporter.write_sep("!", "SLURM NOT TESTED", yellow=True, bold=True)
            terminalreporter.write_line(f"{report.nodeid}: {reason}", yellow=True)
