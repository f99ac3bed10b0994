"""Maths: greedy answers with the model's own sampler, final-answer extraction, exact match."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
STOP_SEQUENCES = ("\nQuestion:", "\n\n")  # a model that runs on into a next question is cut there


def _boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, braces balanced."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def normalize(answer: str) -> str:
    """Canonical form for comparison: no spaces, commas or trailing '.0'; leading zeros dropped."""
    a = answer.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d+(\.0+)?", a):
        return str(int(float(a)))
    return a


def extract_answer(text: str) -> str | None:
    """The final answer of a worked solution: the last ``\\boxed{}``, else the last number."""
    boxed = _boxed(text)
    if boxed is not None:
        return normalize(boxed)
    numbers = _NUMBER.findall(text)
    return normalize(numbers[-1]) if numbers else None


def generate_answers(model, tokenizer, conv, items: list[dict], cfg: dict, seed: int = 0):
    """The model's responses to each item's ``prompt`` with its own sampler (token ids, decoding stats)."""
    from ..core.engine import generate
    from ..core.sampling import Decoding
    from ..data.tokenization import encode_pair

    prompts = [encode_pair(tokenizer, it["prompt"], "", eos=False)[0] for it in items]
    return generate(model, conv, prompts, Decoding.of(cfg, seed=seed), batch_size=cfg["batch_size"])


def evaluate_math(model, tokenizer, conv, items: list[dict], cfg: dict, seed: int = 0) -> dict:
    """Exact match of extracted final answers against ``answer`` on ``items`` ({prompt, answer})."""

    outs, stats = generate_answers(model, tokenizer, conv, items, cfg, seed)
    rows = []
    for it, out in zip(items, outs):
        text = tokenizer.decode(out)
        for stop in STOP_SEQUENCES:
            text = text.split(stop)[0]
        pred = extract_answer(text)
        rows.append(
            {
                "task_id": it["task_id"],
                "answer": it["answer"],
                "prediction": pred,
                "raw": text,
                "correct": pred is not None and pred == normalize(str(it["answer"])),
            }
        )
    return {
        "metrics": {"exact_match": sum(r["correct"] for r in rows) / len(rows)},
        "n_tasks": len(rows),
        "decoding": stats,
        "samples": rows,
    }
