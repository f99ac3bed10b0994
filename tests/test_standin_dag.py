"""The paper DAG offline: the paper_standin preset (paper with stand-ins for what the network and
GPUs provide) runs all_tables to the end on CPU from a stand-in hub cache, with the hub offline."""

import re
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO


def planned_rules(stdout: str) -> set[str]:
    stats = stdout[stdout.index("Job stats:") :].split("\n\n")[0]
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+$", stats, re.M)} - {"total"}


@pytest.fixture(scope="module")
def standin_run(standin_dag):
    """The stand-in DAG's working directory once all_tables has finished there (started with the session)."""
    work = standin_dag.wait(timeout=3600)
    print(f"paper_standin all_tables: {time.time() - standin_dag.started:.0f} s after the session began")
    return work


@pytest.mark.slow
def test_standin_and_paper_plan_the_same_rules(preset_dry_run):
    plans = {}
    for name in ("paper", "paper_standin"):
        proc = preset_dry_run(name)
        assert proc.returncode == 0, proc.stderr[-3000:]
        plans[name] = planned_rules(proc.stdout)
    plans["standin"] = plans.pop("paper_standin")
    assert plans["paper"] == plans["standin"]
    assert {"convert", "dpo_teacher", "dlm_preference", "armap_spectra", "gamma_search", "claims"} <= plans["paper"]


@pytest.mark.paper_dag
def test_every_study_table_has_a_row_per_run(standin_run):
    from ar2dlm.pipeline.config import load_preset

    config = load_preset("paper_standin", REPO / "config")
    for study, spec in config["studies"].items():
        table = pd.read_csv(standin_run / "results" / "tables" / f"{study}.csv")
        for model in spec.get("models") or sorted({m for r in spec["runs"] for m in config["runs"][r]["models"]}):
            runs = set(table.loc[table["model"] == model, "run"])
            trained = [r for r in spec["runs"] if model in config["runs"][r]["models"]]
            assert set(trained) <= runs, (study, model, runs)
    assert (standin_run / "results" / "tables" / "armap" / "main.md").stat().st_size > 0
    claims = pd.read_csv(standin_run / "results" / "claims.csv")
    assert len(claims) == 17 and claims["verdict"].notna().all()


@pytest.mark.paper_dag
def test_the_paper_code_paths_ran(standin_run):
    import json

    results = standin_run / "results"
    # every conversion ran as two FSDP processes (the plan's 2-GPU node)
    logs = sorted((results / "logs" / "convert").glob("*.log"))
    assert logs and all(log.with_name(log.name + ".rank1").is_file() for log in logs)
    # lm-eval's own aime24 and gpqa_diamond_zeroshot through the ar2dlm class, from the cached hub data sets
    aime = json.loads((results / "eval" / "aime24" / "qwen3_8b" / "teacher.json").read_text())
    gpqa = json.loads((results / "eval" / "gpqa_diamond" / "qwen3_4b" / "teacher.json").read_text())
    assert "exact_match" in aime["metrics"] and "acc" in gpqa["metrics"]
    mteb = json.loads((results / "eval" / "mteb" / "qwen3_4b" / "ed" / "seed0" / "step_2.json").read_text())
    assert set(mteb["tasks"]) == {"SciFact", "NFCorpus", "STSBenchmark", "Banking77Classification"}
    # MBPP+ through evalplus's sanitizer, HumanEval+ with its plus inputs
    mbpp = json.loads((results / "eval" / "mbpp_plus" / "qwen3_0_6b" / "teacher.json").read_text())
    assert mbpp["n_tasks"] == 3 and "plus_pass@1" in mbpp["metrics"]
    # the Base convention: eos = pad = <|endoftext|>, <|mask|> added at 151669
    conv = json.loads((results / "models" / "qwen3_8b" / "teacher" / "ar2dlm.json").read_text())
    assert conv["eos_token_id"] == conv["pad_token_id"] == 151643 and conv["mask_token_id"] == 151669
    # AR-MAP: LoRA DPO, spectra and a gamma search over the grid
    gamma = json.loads(
        (results / "armap" / "qwen3_4b" / "ed" / "seed0" / "helpful" / "ties" / "gamma.json").read_text()
    )
    assert gamma
    assert (results / "armap" / "qwen3_4b" / "ed" / "seed0" / "math" / "spectra.csv").stat().st_size > 0
    # AR-MAP's three domains, each on its own benchmark: TruthfulQA MC2 and GSM8K through lm-eval, helpfulness
    # judged by the (stand-in) reward model against the held-out chosen answers
    derived = results / "eval" / "{}" / "qwen3_4b" / "ed" / "seed0" / "{}.json"
    for bench, domain, metric in (
        ("truthfulqa_mc2", "truthful", "acc"),
        ("helpfulness", "helpful", "win_rate"),
        ("gsm8k", "math", "exact_match"),
    ):
        for name in (f"armap_{domain}_task_arithmetic", f"dlm_dpo_{domain}"):
            res = json.loads(Path(str(derived).format(bench, name)).read_text())
            assert 0 <= res["metrics"][metric] <= 1, (bench, name)
    helpful = json.loads(Path(str(derived).format("helpfulness", "armap_helpful_task_arithmetic")).read_text())
    assert helpful["judge"] == "Skywork/Skywork-Reward-V2-Qwen3-0.6B" and helpful["n_tasks"] == 3
