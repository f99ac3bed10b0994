"""Helpfulness judged by a local reward model.

The model answers held-out prompts of a preference domain with its own sampler; a reward model (a
sequence classifier with one output, as Skywork-Reward-V2) scores its answer and the domain's chosen
(human-preferred) answer to the same prompt. ``win_rate``: the share of prompts where the model's
answer scores at least the chosen one's (AR-MAP counts a tie as a win; scores within ``TIE`` are one);
``mean_reward`` beside it.

Why a reward model: AR-MAP judges helpfulness with GPT-4o-mini, pairwise against the base DLM's own
answers on AlpacaEval and Arena-Hard prompts; no lm-eval task measures open-ended helpfulness
without such a judge, and compute nodes have no network. A local reward model, fetched once by
``snakemake prefetch``, is the offline judge, and the preference data's chosen answers are one fixed
reference every model (teacher, DLM, merged, directly DPO'd) is compared with.
"""

from __future__ import annotations

import torch

from ..core.models import LoadedModel

TIE = 1e-4  # rewards this close are a tie: the same text scored in batches of other lengths moves the last bits


def reward_scores(
    judge_dir: str, prompts: list[str], responses: list[str], batch_size: int = 8, device="cpu"
) -> list[float]:
    """The reward model's score of each (prompt, response): its single logit, the conversation
    written with the judge's chat template (its own format), else as prompt and response paragraphs.
    On ``device``: in bf16 on a GPU (as reward models are served), fp32 on a CPU."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tok = AutoTokenizer.from_pretrained(judge_dir)
    judge = AutoModelForSequenceClassification.from_pretrained(judge_dir, num_labels=1, torch_dtype=dtype)
    judge.to(device).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    judge.config.pad_token_id = tok.pad_token_id
    if tok.chat_template:
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": p}, {"role": "assistant", "content": r}], tokenize=False
            )
            for p, r in zip(prompts, responses)
        ]
    else:
        texts = [f"{p}\n\n{r}" for p, r in zip(prompts, responses)]
    scores = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i : i + batch_size], return_tensors="pt", padding=True, truncation=True).to(device)
            scores += judge(**enc).logits[:, 0].float().tolist()
    return scores


def evaluate_reward(loaded: LoadedModel, items: list[dict], cfg: dict, judge_dir: str, seed: int = 0) -> dict:
    """Win rate of the loaded model's answers against each item's ``chosen`` answer under the judge
    in ``judge_dir``, and the mean rewards ({prompt, chosen} items: a preference domain's held-out
    split)."""
    from .maths import generate_answers

    model, tokenizer, conv, _ = loaded
    outs, stats = generate_answers(model, tokenizer, conv, items, cfg, seed)
    answers = [tokenizer.decode(o, skip_special_tokens=True).strip() for o in outs]
    texts = [it["prompt"] for it in items]
    batch, device = cfg.get("judge_batch_size", 8), next(model.parameters()).device
    model.cpu()  # the judge takes the evaluated model's device, not both at once
    own = reward_scores(judge_dir, texts + texts, answers + [it["chosen"] for it in items], batch, device)
    own, ref = own[: len(texts)], own[len(texts) :]
    wins = [a >= b - TIE for a, b in zip(own, ref)]
    return {
        "metrics": {
            "win_rate": sum(wins) / len(wins),
            "mean_reward": sum(own) / len(own),
            "mean_reference_reward": sum(ref) / len(ref),
        },
        "n_tasks": len(items),
        "judge": cfg["judge"],
        "decoding": stats,
        "samples": [
            {"prompt": t, "answer": a, "reward": r, "reference_reward": b, "win": w}
            for t, a, r, b, w in zip(texts, answers, own, ref, wins)
        ],
    }
