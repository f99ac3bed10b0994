"""The method registry: a method with a new loss term, written in a module outside the package and
named by the config's ``methods:``, passes config validation, the dry run, the planner and training
with no file of the project changed."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, run_snakemake
from tests.shared import convert_argv

TOY = "ar2dlm_toy_method"
TOY_MODULE = '''
"""A toy method: masked diffusion plus a new loss term, the mean squared last hidden state at the
masked positions, times a weight."""
from ar2dlm.training.objectives.diffusion import Diffusion
from ar2dlm.methods.spec import Method, Term

LIMIT = 10.0


def hidden_norm(run, conv, step):
    h = step.student.hidden_states[-1]
    if conv.attention == "block":
        h = h[:, step.batch.clean.shape[1]:]
    where = step.batch.masked
    if not where.any():
        return h.sum() * 0.0
    per = h[where].float().pow(2).mean(-1)
    total = step.whole_count(lambda b: b.masked)
    return run["hidden_norm"]["weight"] * (per.mean() if total is None else per.sum() / total.clamp(min=1))


def too_heavy(run, config):
    if run["hidden_norm"]["weight"] > LIMIT:
        yield "hidden_norm.weight", f"{run['hidden_norm']['weight']} exceeds {LIMIT}: the penalty would drown the loss"


def memory(sz):  # the last hidden state's fp32 copy
    return {"activations": 4 * sz.launch.rows * sz.positions * sz.shape.hidden}


def flops(shape, run, checkpointing):  # square and sum, per position of the step
    return 2.0 * run["training"]["batch_size"] * run["training"]["seq_len"] * shape.hidden


TERM = Term(key="hidden_norm", noun="a hidden-state norm penalty", defaults={"weight": 0.1}, loss=hidden_norm,
            student_hidden=True, checks=too_heavy, memory=memory, flops=flops,
            schema={"type": "object", "additionalProperties": False,
                    "properties": {"weight": {"type": "number", "minimum": 0}}})
METHOD = Method(name="toy", objective=Diffusion, defaults={"hidden_norm": {"weight": 0.1}}, requires=("hidden_norm",))
'''
OVERRIDE = {"methods": [TOY], "runs": {"toy": {"method": "toy", "hidden_norm": {"weight": 0.5}}}}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy module in a folder of its own on sys.path; the registry as it was afterwards."""
    from ar2dlm.methods import registry

    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / f"{TOY}.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    for table in ("METHODS", "TERMS", "_MODULES"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    yield folder
    for name in [n for n, m in sys.modules.items() if str(getattr(m, "__file__", None)).startswith(str(folder))]:
        sys.modules.pop(name)


def smoke_with(override: dict) -> dict:
    from ar2dlm.pipeline.config import merge_preset

    return merge_preset({"preset": "smoke", **override}, REPO / "config")


def test_a_method_with_a_new_loss_term_from_outside_the_package(toy, tmp_path, standin_hub, smoke_tokenizer):
    from ar2dlm.pipeline.checks import check_config
    from ar2dlm.pipeline.config import ConfigError, validate_config
    from ar2dlm.plan.memory import QWEN3_SHAPES, Launch, estimate, plan_job, step_flops

    schema = REPO / "config" / "schema.yaml"
    # config validation: the schema takes the method and the term from the registry, the term checks itself
    cfg = smoke_with(OVERRIDE)
    validate_config(cfg, schema)
    resolved = check_config(cfg)
    run = resolved.run("toy")
    assert run["hidden_norm"] == {"weight": 0.5} and run["method_modules"] == [TOY]
    assert run["attention"] == "bidirectional" and run["align"] is None  # mdlm's conventions, no other term
    assert "method_modules" not in resolved.run("ra")  # a built-in run's settings are untouched
    for override, key, words in (
        ({"hidden_norm": {"weight": "heavy"}}, "runs.toy.hidden_norm.weight", "not of type"),
        ({"hidden_norm": {"wieght": 1}}, "runs.toy.hidden_norm", "wieght"),
        ({"hidden_norm": {"weight": 50}}, "runs.toy.hidden_norm.weight", "exceeds 10.0"),
    ):
        bad = smoke_with({**OVERRIDE, "runs": {"toy": {"method": "toy", **override}}})
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
            validate_config(bad, schema)
            check_config(bad)
        assert words in str(err.value)
    with pytest.raises(ConfigError, match=r"methods\.0.*'no_such_module'.*PYTHONPATH"):
        validate_config(smoke_with({"methods": ["no_such_module"]}), schema)

    # the dry run: a fresh Snakemake process imports the module, and the convert job's settings name it
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(OVERRIDE))
    workdir = tmp_path / "wd"
    workdir.mkdir()
    manifest = "results/models/tiny/toy/seed0/train.json"
    proc = run_snakemake(
        ["-n", "-p", manifest, "--configfile", str(REPO / "config" / "presets" / "smoke.yaml"), str(override)],
        workdir,
        timeout=300,
        hub_cache=standin_hub,
        PYTHONPATH=os.pathsep.join([str(toy), os.environ.get("PYTHONPATH", "")]),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    convert = next(b for b in proc.stdout.split("\n\n") if "rule convert:" in b and "/toy/" in b)
    assert TOY in convert and "hidden_norm" in convert

    # the planner counts the term's memory and FLOPs
    settings = resolved.conversion_settings("toy")
    shape, launch = QWEN3_SHAPES["Qwen/Qwen3-0.6B-Base"], Launch(1, 8, 2, False, False)
    without = {**settings, "method": "mdlm", "hidden_norm": None}
    parts, base = estimate(shape, settings, launch), estimate(shape, without, launch)
    assert parts["activations"] - base["activations"] == 4 * 2 * settings["training"]["seq_len"] * shape.hidden
    assert {k: v for k, v in parts.items() if k != "activations"} == {k: base[k] for k in parts if k != "activations"}
    tr = settings["training"]
    assert step_flops(shape, settings, False) - step_flops(shape, without, False) == pytest.approx(
        2.0 * tr["batch_size"] * tr["seq_len"] * shape.hidden
    )
    cluster = {
        "gpu_memory_gb": 80,
        "gpus_per_node": 4,
        "max_nodes": 1,
        "gpu_tflops": 100,
        "mfu": 0.4,
        "runtime_hours": 4,
        "gpu_bandwidth_tb_s": 2,
    }
    plan = plan_job("tiny/toy", shape, settings, cluster)
    assert plan.launch is not None and plan.parts == estimate(shape, settings, plan.launch)

    # two training steps in a fresh process, as the convert job runs them: it finds the module from the settings
    from ar2dlm.core.models import build_qwen3, save_model
    from ar2dlm.provenance import write_jsonl
    from ar2dlm.training.teacher import ar_conventions

    tok, docs = smoke_tokenizer
    teacher = tmp_path / "teacher"
    save_model(build_qwen3(cfg["models"]["tiny"]["arch"], tok), tok, teacher, {**ar_conventions(tok), "method": "test"})
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    train = dict(
        settings, training={**tr, "steps": 2, "batch_size": 4, "seq_len": 64, "checkpoint_every": 2, "warmup_steps": 1}
    )
    out = tmp_path / "toy" / "train.json"
    cmd = [
        sys.executable,
        "-m",
        "ar2dlm.training.convert_run",
        *convert_argv(train, teacher, tmp_path / "corpus.jsonl", out),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(toy)]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out.parent / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["hidden_norm"] > 0 and r["diffusion"] > 0 and r["flops_teacher"] == 0
        assert r["loss"] == pytest.approx(r["diffusion"] + r["hidden_norm"])
    assert json.loads(out.read_text())["checkpoints"] == [2]


def test_every_built_in_run_keeps_its_objective_teacher_and_planned_parts():
    """The registry composes what the runs of the presets always trained: their objective, the
    teacher it loads, and the parts the planner counts."""
    from ar2dlm.core.conventions import Conventions
    from ar2dlm.methods.registry import active_parts, compose, objective_for, teacher_of
    from ar2dlm.pipeline.resolved import resolve

    runs = resolve(smoke_with({})).runs
    expected = {
        "mdlm": ("Diffusion", (False, False), []),
        "ra": ("Diffusion", (True, False), ["align"]),
        "ed": ("Diffusion", (False, False), []),
        "opd": ("Distillation", (True, True), []),
        "combined": ("Distillation", (True, True), ["align"]),
    }
    for name, (objective, teacher, added) in expected.items():
        run = runs[name]
        conv = Conventions(run["attention"], run["shift"], 5, 1, 2, run["block_size"])
        made = objective_for(run, conv, 0)
        assert type(made).__name__ == objective and (made.needs_teacher, made.teacher_head) == teacher, name
        assert [t.key for t in made.added] == added == [t.key for t in compose(run).added]
        assert teacher_of(run) == teacher
        computed = [run["method"], *added, *(["distill"] if run["distill"] else [])]
        assert [getattr(p, "key", getattr(p, "name", None)) for p in active_parts(run)] == computed, name
    ra = runs["ra"].as_dict()
    ra["align"]["lambda"] = 0.0  # named but not computed: no teacher, nothing added
    assert teacher_of(ra) == (False, False) and compose(ra).added == [] and len(active_parts(ra)) == 1


def test_a_term_that_is_taken_or_incomplete_is_refused(toy):
    """A module outside the package that defines a taken name or key, or neither a METHOD nor a TERM, is
    refused when the config's ``methods:`` imports it."""
    from ar2dlm.methods.registry import import_methods
    from ar2dlm.methods.spec import Term

    header = (
        "from ar2dlm.training.objectives.diffusion import Diffusion\nfrom ar2dlm.methods.spec import Method, Term\n"
    )
    for i, (body, words) in enumerate(
        [
            ('TERM = Term(key="align", noun="x", schema={}, loss=lambda *a: 0)', "'align' is taken"),
            ('TERM = Term(key="shift", noun="x", schema={}, loss=lambda *a: 0)', "'shift' is taken"),
            ('METHOD = Method(name="mdlm", objective=Diffusion)', "'mdlm' is registered already"),
            ("LOSS = None", "defines neither METHOD nor TERM"),
        ]
    ):
        (toy / f"taken_{i}.py").write_text(header + body + "\n")
        with pytest.raises(ValueError, match=words):
            import_methods([f"taken_{i}"])
    with pytest.raises(ValueError, match="exactly one of loss"):
        Term(key="nothing", noun="x", schema={})


def test_an_objective_unlike_its_declaration_is_refused_when_built(monkeypatch):
    """A method's declaration is what the planner and the config checks read without importing its
    objective: the objective built for training must read the teacher and take added terms as declared."""
    from ar2dlm.core.conventions import Conventions
    from ar2dlm.methods import registry
    from ar2dlm.methods.spec import Method
    from ar2dlm.pipeline.resolved import resolve

    run = resolve(smoke_with({})).runs["mdlm"].as_dict()
    conv = Conventions(run["attention"], run["shift"], 5, 1, 2, run["block_size"])
    diffusion = "ar2dlm.training.objectives.diffusion:Diffusion"
    for declared, words in [
        (Method(name="mdlm", objective=diffusion, teacher="head"), "declares teacher='head'"),
        (Method(name="mdlm", objective=diffusion, takes_terms=False), "is a ComposedObjective"),
        (Method(name="mdlm", objective="ar2dlm.training.objectives.diffusion:Nothing"), "names nothing importable"),
    ]:
        monkeypatch.setitem(registry.METHODS, "mdlm", declared)
        with pytest.raises(ValueError, match=words):
            registry.objective_for(run, conv, 0)
