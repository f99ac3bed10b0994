"""Synthetic arithmetic suite with exact-match integer answers (the maths analogue of AIME).

A question is a two-operation expression; the answer is written as a short worked chain that ends
in the final number, so final-answer extraction (last number, or ``\\boxed{}``) applies unchanged.
"""

from __future__ import annotations

import random

OPS = ["+", "-", "*"]


def _operand(rng: random.Random, op: str) -> int:
    return rng.randint(2, 9) if op == "*" else rng.randint(1, 30)


def make_problem(rng: random.Random) -> dict:
    op1, op2 = rng.choice(OPS), rng.choice(OPS)
    a, b = rng.randint(1, 30), _operand(rng, op1)
    c = _operand(rng, op2)
    inner = eval(f"{a} {op1} {b}")  # noqa: S307 - our own integer expression
    answer = eval(f"{inner} {op2} {c}")  # noqa: S307
    question = f"({a} {op1} {b}) {op2} {c}"
    return {
        "prompt": f"Question: What is {question}?\nAnswer:",
        "completion": f" {a} {op1} {b} = {inner}. {inner} {op2} {c} = {answer}. The answer is {answer}.",
        "answer": str(answer),
        "expression": question,
    }


def generate_math_suite(n_train: int, n_eval: int, seed: int, n_valid: int = 0):
    """Return (train, eval, valid); no expression appears in two splits. Deterministic in ``seed``: the
    validation problems are drawn after the others, so adding them changes neither."""
    rng = random.Random(f"{seed}-math")
    seen, problems = set(), []
    while len(problems) < n_train + n_eval + n_valid:
        p = make_problem(rng)
        if p["expression"] in seen:
            continue
        seen.add(p["expression"])
        problems.append(p)
    parts, start = [], 0
    for split, n in (("train", n_train), ("eval", n_eval), ("valid", n_valid)):
        part, start = problems[start : start + n], start + n
        for i, p in enumerate(part):
            p["task_id"] = f"Arith/{split}/{i}"
        parts.append(part)
    return tuple(parts)


def choice_items(items: list[dict], n_choices: int = 4, seed: int = 0) -> list[dict]:
    """Multiple-choice form of arithmetic items: the worked answer and ``n_choices - 1`` chains whose
    final answer is wrong (another number replaces the answer wherever it appears), shuffled."""
    import re

    rng = random.Random(f"{seed}-choice")
    out = []
    for it in items:
        answer = int(it["answer"])
        wrong = rng.sample([answer + d for d in range(-12, 13) if d], n_choices - 1)
        choices = [it["completion"]] + [
            re.sub(rf"(?<![\d-]){re.escape(it['answer'])}(?!\d)", str(w), it["completion"]) for w in wrong
        ]
        order = list(range(n_choices))
        rng.shuffle(order)
        out.append(
            {
                "task_id": it["task_id"],
                "prompt": it["prompt"],
                "choices": [choices[i] for i in order],
                "label": order.index(0),
            }
        )
    return out
