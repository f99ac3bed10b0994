"""Preference pairs (prompt, chosen, rejected) built from the synthetic suites.

code: chosen = the canonical body; rejected = a mutated body whose outputs differ on the task's
tests (a changed constant, a swapped operator or a dropped line). arithmetic: chosen = the correct
worked answer; rejected = the same chain with a wrong intermediate or final number.
"""

from __future__ import annotations

import random
import re

from .code_suite import run_solution

_SWAPS = [
    (" + ", " - "),
    (" - ", " + "),
    (" * ", " + "),
    (" // ", " % "),
    (" % ", " // "),
    (" > ", " < "),
    (" < ", " > "),
    ("max(", "min("),
    ("min(", "max("),
    (".upper()", ".lower()"),
    ("[:", "[1:"),
    ("return len(", "return 1 + len("),
]


def _mutations(body: str, rng: random.Random):
    lines = body.splitlines(keepends=True)
    cands = []
    for m in re.finditer(r"(?<![\w'])(\d+)(?![\w'])", body):
        k = int(m.group(1))
        cands.append(body[: m.start()] + str(k + rng.choice([1, 2, 3])) + body[m.end() :])
    for m in re.finditer(r"'([a-j])'", body):
        other = rng.choice([ch for ch in "abcdefghij" if ch != m.group(1)])
        cands.append(body[: m.start()] + f"'{other}'" + body[m.end() :])
    for old, new in _SWAPS:
        if old in body:
            cands.append(body.replace(old, new, 1))
    for i, ln in enumerate(lines):
        if "return" not in ln and not ln.rstrip().endswith(":") and len(lines) >= 2:
            cands.append("".join(lines[:i] + lines[i + 1 :]))
    rng.shuffle(cands)
    return cands


def code_rejected(task: dict, rng: random.Random) -> str | None:
    """A body that runs but disagrees with the canonical solution on the task's inputs."""
    inputs = task["base_input"] + task["plus_input"]
    want = run_solution(task["prompt"] + task["canonical_solution"], task["entry_point"], inputs)
    for body in _mutations(task["canonical_solution"], rng):
        try:
            got = run_solution(task["prompt"] + body, task["entry_point"], inputs)
        except Exception:  # a mutation may not compile or may raise; try the next one
            continue
        if got != want:
            return body
    return None


def math_rejected(problem: dict, rng: random.Random) -> str:
    numbers = list(re.finditer(r"-?\d+", problem["completion"]))
    # Corrupt the intermediate result (and everything after it), or only the final answer.
    answer = int(problem["answer"])
    wrong = answer + rng.choice([-3, -2, -1, 1, 2, 3, 10])
    text = problem["completion"]
    return text[: numbers[-2].start()] + str(wrong) + ". The answer is " + str(wrong) + "."


def make_preferences(domain: str, items: list[dict], n: int, seed: int, split: str) -> list[dict]:
    rng = random.Random(f"{seed}-pref-{domain}-{split}")
    order = list(range(len(items)))
    rng.shuffle(order)
    pairs = []
    for idx in order:
        if len(pairs) == n:
            break
        item = items[idx]
        if domain == "code":
            rejected = code_rejected(item, rng)
            if rejected is None:
                continue
            chosen = item["canonical_solution"]
        elif domain == "math":
            chosen, rejected = item["completion"], math_rejected(item, rng)
        else:
            raise ValueError(f"unknown preference domain {domain!r} (known: code, math)")
        pairs.append(
            {
                "domain": domain,
                "source_id": item["task_id"],
                "prompt": item["prompt"],
                "chosen": chosen,
                "rejected": rejected,
            }
        )
    if len(pairs) < n:
        raise ValueError(
            f"data.preferences.n_{split}={n} but only {len(pairs)} {domain} pairs could be built "
            f"from {len(items)} {split} items"
        )
    return pairs
