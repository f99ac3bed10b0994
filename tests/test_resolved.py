"""The config resolved once into frozen, typed objects: each run's settings computed once per DAG build,
read-only wherever they are read, and the job lists and studies built from them."""

import dataclasses

import pytest

from tests.conftest import REPO


def test_the_dag_build_resolves_each_run_once_and_every_reader_shares_it(monkeypatch):
    from ar2dlm.methods import registry
    from ar2dlm.pipeline import runs
    from ar2dlm.pipeline.checks import checked_config
    from ar2dlm.plan.launch import plan_cluster
    from ar2dlm.reporting.claims import claim_inputs

    calls = []
    real = registry.settings

    def counted(own):
        calls.append(own["method"])
        return real(own)

    monkeypatch.setattr(runs, "settings", counted)
    resolved = checked_config({"preset": "paper"}, REPO / "config")  # checks, plans and job lists all read runs
    plan_cluster(resolved)
    claim_inputs(resolved)
    assert resolved.conversions and resolved.evals[0] and resolved.armap.search
    assert len(calls) == len(resolved.config["runs"])  # each run resolved once, however many readers


def test_resolved_objects_are_read_only():
    from ar2dlm.pipeline.config import ConfigError, merge_preset
    from ar2dlm.pipeline.resolved import resolve

    resolved = resolve(merge_preset({"preset": "tiny"}, REPO / "config"))
    run = resolved.run("ed")
    steps = run.steps
    run["training"]["steps"] = steps + 1  # a reader's copy
    assert run.steps == run["training"]["steps"] == steps and run.as_dict()["training"]["steps"] == steps
    with pytest.raises(TypeError):
        run["block_size"] = 2
    with pytest.raises(TypeError):
        resolved.runs["ed"] = run
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.runs = {}
    study = resolved.studies["efficient_dlm/tradeoff"]
    study.spec["runs"].append("mdlm")
    assert "mdlm" not in study.spec["runs"]
    settings = resolved.benchmarks["synthetic_code"].settings
    settings["limit"] = 1
    assert resolved.benchmarks["synthetic_code"].settings["limit"] != 1
    with pytest.raises(ConfigError, match=r"'runs\.nope'.*no such run"):
        resolved.run("nope")


def test_a_study_reads_its_runs_seeds_and_steps_from_the_resolved_runs():
    from ar2dlm.pipeline.config import ConfigError, merge_preset
    from ar2dlm.pipeline.resolved import resolve

    cfg = merge_preset({"preset": "tiny"}, REPO / "config")
    cfg["studies"]["probe"] = {
        "runs": ["ed", "mdlm"],
        "evals": ["synthetic_code"],
        "seeds": [0, 1],
        "run_seeds": {"mdlm": [2]},
        "checkpoints": "all",
    }
    resolved = resolve(cfg)
    study, ed = resolved.studies["probe"], resolved.run("ed")
    assert study.seeds("ed") == [0, 1] and study.seeds("mdlm") == [2]
    member = next(m for m in study.members if m.run == "ed")
    assert member.steps == ed.checkpoint_steps() and member.final_step == ed.steps == member.steps[-1]
    assert {("ed", 1), ("mdlm", 2)} <= {(c.run, c.seed) for c in resolved.conversions}
    cfg["studies"]["probe"]["runs"].append("nope")
    with pytest.raises(ConfigError, match=r"'studies\.probe\.runs'.*'nope'"):
        assert not resolve(cfg).conversions  # the job lists read every study: refused before
