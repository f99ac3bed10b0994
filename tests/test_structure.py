"""The package's shape: no import loop, layers that point down only, and the schema's names tied to the
registries that implement them."""

import ast
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

PACKAGE = REPO / "ar2dlm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_lines(path: Path, modules: set[str]) -> dict[str, int]:
    """Package modules a file imports, at top level or inside functions (a lazy import is still an
    edge), each with the line of its first import."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:  # `from . import layout` names a module, `from .x import f` a function
                full = f"{base}.{alias.name}"
                m = full if full in modules else base
                out[m] = min(out.get(m, node.lineno), node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.name] = min(out.get(alias.name, node.lineno), node.lineno)
    return {m: line for m, line in out.items() if m in modules and m != name}


def _imports(path: Path, modules: set[str]) -> set[str]:
    return set(_import_lines(path, modules))


def test_no_import_loop_in_the_package():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _imports(f, modules) for f in files}
    # a package's __init__ runs before its modules: importing a.b imports a
    for m in modules:
        for parent in (m.rsplit(".", i)[0] for i in range(1, m.count(".") + 1)):
            if parent in modules and parent != m:
                graph[m] = graph[m] | {parent}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                raise AssertionError("import loop: " + " -> ".join(stack[stack.index(n) :] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    # the graph sees the edges it should
    assert graph["ar2dlm.pipeline.checks"] >= {"ar2dlm.pipeline.resolved"}
    assert graph["ar2dlm.pipeline.resolved"] >= {"ar2dlm.pipeline.runs"}


# The package's layers, lowest first: a module imports only from its own layer and those below, so
# the library never reaches up into the pipeline that drives it (paths and settings are passed in).
# The root (the package's own __init__ and the provenance helpers) is below everything; ``plan``
# sizes the jobs ``pipeline`` lists, and ``reporting`` reads what the pipeline's layout names.
# ``methods`` sits below ``training``: a method declares itself (settings, checks, planner hooks) and
# names its objective by import path, which the trainer imports; the pipeline reads the declarations
# without torch.
LAYERS = (
    "",
    "provenance",
    "core",
    "data",
    "methods",
    "training",
    "evaluation",
    "armap",
    "pipeline",
    "plan",
    "reporting",
)


def _rank(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name == layer or isinstance(layer, tuple) and name in layer)


def _named(rank: int) -> str:
    layer = LAYERS[rank]
    return "/".join(layer) if isinstance(layer, tuple) else layer


def _layer(module: str) -> int:
    """The rank in LAYERS of a package module: its subpackage, or the top-level module itself."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else ""
    known = {n for layer in LAYERS for n in (layer if isinstance(layer, tuple) else [layer])}
    assert name in known, f"{module} is in no layer: add {name!r} to LAYERS in {Path(__file__).name}"
    return _rank(name)


def test_layers_point_down_only():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    upward = [
        f"{f.relative_to(REPO)}:{line} imports {target} ({_named(_layer(target))} sits above "
        f"{_named(_layer(_module_name(f))) or 'the package root'})"
        for f in files
        for target, line in sorted(_import_lines(f, modules).items())
        if _layer(target) > _layer(_module_name(f))
    ]
    order = " < ".join(_named(i) for i in range(1, len(LAYERS)))
    assert not upward, f"imports that point up the layers ({order}):\n" + "\n".join(upward)
    library = ("core", "data", "training", "methods", "evaluation", "armap")  # what the issue pins: below the pipeline
    assert max(map(_rank, library)) < _rank("pipeline") < _rank("reporting")


LONGEST_FUNCTION = 80  # lines from its `def` to its last, docstring included


def test_no_function_of_the_package_is_longer_than_80_lines():
    """A function that needs more than a screen is split where its steps part (checks by section, a
    tracer's model set-up, a folder's row table)."""
    long = [
        f"{f.relative_to(REPO)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for f in sorted(PACKAGE.rglob("*.py"))
        for n in ast.walk(ast.parse(f.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > LONGEST_FUNCTION
    ]
    assert not long, "\n".join(long)


def test_the_package_is_subpackages_only():
    """The core, training, methods, evaluation, AR-MAP, data, pipeline bookkeeping and reporting each
    have a subpackage; the top level keeps only the shared provenance helpers."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "provenance.py"]
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == {
        "core",
        "data",
        "training",
        "methods",
        "evaluation",
        "armap",
        "pipeline",
        "reporting",
        "plan",
    }


def _schema():
    return yaml.safe_load((REPO / "config" / "schema.yaml").read_text())["properties"]


def test_schema_names_match_the_registries():
    from ar2dlm.armap.merge import MERGES
    from ar2dlm.evaluation.suite import BENCHMARK_KINDS
    from ar2dlm.methods.registry import METHODS, TERMS
    from ar2dlm.pipeline.config import config_schema
    from ar2dlm.reporting.captions import FIGURE_CAPTIONS
    from ar2dlm.reporting.figures import FIGURE_KINDS

    schema = _schema()
    bench = schema["eval"]["properties"]["benchmarks"]["additionalProperties"]
    assert set(bench["properties"]["kind"]["enum"]) == set(BENCHMARK_KINDS)
    study = schema["studies"]["additionalProperties"]["properties"]
    assert set(study["figure"]["enum"]) == set(FIGURE_KINDS) == set(FIGURE_CAPTIONS)
    merges = schema["armap"]["properties"]["merges"]["properties"]
    assert set(merges) == set(MERGES) == set(schema["armap"]["properties"]["eval_merges"]["items"]["enum"])
    for name, merge in MERGES.items():  # each merge's options are its config keys
        assert set(merges[name].get("properties", {})) == set(merge.options), name
    # a method's names and a loss term's options have one home, its module: the schema file names
    # none of them, and the schema the config is validated with takes them from the registry
    static = schema["runs"]["additionalProperties"]["properties"]
    assert "enum" not in static["method"] and not set(static) & set(TERMS)
    run = config_schema(REPO / "config" / "schema.yaml")["properties"]["runs"]["additionalProperties"]["properties"]
    assert run["method"]["enum"] == [name for name, m in METHODS.items() if m.conversion]
    assert {"mdlm", "repr_align", "efficient_dlm", "opdlm"} <= set(run["method"]["enum"])
    assert "dpo" not in run["method"]["enum"]
    assert all(run[key] == term.schema for key, term in TERMS.items()) and {"align", "distill"} <= set(TERMS)


def test_benchmark_kinds_name_their_metrics_and_inputs():
    """Every kind's metrics are what its evaluation writes, and its inputs are results files."""
    from ar2dlm.evaluation.suite import BENCHMARK_DATA, BENCHMARK_KINDS, LOCAL_HARNESS_TASKS
    from ar2dlm.pipeline.layout import benchmark_inputs

    assert LOCAL_HARNESS_TASKS == ("arith_choice",)
    spec = {"local": True, "tasks": ["docstring_retrieval"], "domain": "helpful"}
    for name, kind in BENCHMARK_KINDS.items():
        assert kind.metrics, name
        assert kind.reads(spec) and {r.split(":")[0] for r in kind.reads(spec)} <= set(BENCHMARK_DATA), name
        assert all(p.startswith("results/data/") for p in benchmark_inputs(name, kind.reads(spec)).values()), name
    every = [d if d != "preferences" else "preferences:helpful" for d in BENCHMARK_DATA]
    assert set(benchmark_inputs("b", every)) == set(every)  # the layout places every kind of data
    assert benchmark_inputs("b", every)["preferences:helpful"] == "results/data/preferences/helpful/eval.jsonl"
    with pytest.raises(ValueError, match="reads \\['answers'\\]: no such data"):
        benchmark_inputs("b", ("answers",))


def test_jobs_run_the_checkout_of_the_snakefile(tmp_path, monkeypatch):
    from ar2dlm.pipeline.config import use_checkout

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    use_checkout(REPO)
    import os

    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(REPO.resolve()), "/elsewhere"]
    other = tmp_path / "other_checkout"
    (other / "ar2dlm").mkdir(parents=True)
    try:
        use_checkout(other)
    except RuntimeError as exc:
        assert str(other / "ar2dlm") in str(exc) and str(REPO / "ar2dlm") in str(exc)
    else:
        raise AssertionError("another checkout's Snakefile was accepted")


def _string_literals(path: Path):
    """(line, value) of every string constant in a Python file (f-string parts included)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _schema_words(node) -> set[str]:
    """Every value an ``enum`` of the schema allows: the package's own vocabulary (a method name)."""
    if isinstance(node, dict):
        return set(node.get("enum", [])) | {w for v in node.values() for w in _schema_words(v)}
    if isinstance(node, list):
        return {w for v in node for w in _schema_words(v)}
    return set()


def test_no_run_name_of_a_preset_appears_in_the_package():
    """Runs, studies and the claims that compare them are config: the package never names a run a
    preset defines (a quoted string equal to one), save words the schema itself defines, such as a
    method a run is named after."""
    names = set()
    for preset in sorted((REPO / "config" / "presets").glob("*.yaml")):
        names |= set(yaml.safe_load(preset.read_text()).get("runs") or {})
    assert {"ra", "ed", "opd_math", "combined"} <= names
    from ar2dlm.pipeline.config import config_schema  # the schema with the registry's method names

    names -= _schema_words(config_schema(REPO / "config" / "schema.yaml"))
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, value in sorted(_string_literals(path))
        if value in names
    ]
    assert not found, "run names of a preset in the package:\n" + "\n".join(found)
