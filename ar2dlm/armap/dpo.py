"""DPO on the AR teacher with TRL, and the baseline: DPO directly on a DLM with ELBO log-likelihoods.

TRL's ``DPOTrainer`` scores sequences causally, so it cannot train a DLM; the DLM baseline is the
same loss with each log-likelihood replaced by a Monte Carlo ELBO whose masks are shared between
the policy and the frozen reference for each sequence (VRPO's variance reduction: the mask noise
cancels in the log-ratio), written here because no library implements it.
"""

from __future__ import annotations

import tempfile
import time

import torch

from ..conventions import Conventions
from ..models import load_conventions, load_model, save_model
from ..provenance import library_versions

FIELDS = ("prompt", "chosen", "rejected")


def train_ar_dpo(model_dir, train_rows: list[dict], eval_rows: list[dict], out_dir, cfg: dict, seed: int,
                 domains: list[str]) -> dict:
    """DPO of a causal model with TRL (fp32 on CPU); saves an HF folder with the conventions and
    provenance, including TRL's reward accuracy on the held-out pairs before and after."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    info = load_conventions(model_dir)
    if info["attention"] != "causal":
        raise ValueError(f"{model_dir} is a {info['attention']}-attention model; TRL's DPO trains causal models")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    to_ds = lambda rows: Dataset.from_list([{k: r[k] for k in FIELDS} for r in rows])  # noqa: E731
    gpu = torch.cuda.is_available()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        args = DPOConfig(output_dir=tmp, beta=cfg["beta"], max_steps=cfg["steps"], learning_rate=cfg["lr"],
                         per_device_train_batch_size=cfg["batch_size"], per_device_eval_batch_size=cfg["batch_size"],
                         lr_scheduler_type="cosine", warmup_steps=max(1, cfg["steps"] // 10),
                         max_length=cfg["max_length"], logging_steps=10, save_strategy="no", eval_strategy="no",
                         report_to=[], use_cpu=not gpu, bf16=gpu, seed=seed, data_seed=seed)
        trainer = DPOTrainer(model=model, args=args, train_dataset=to_ds(train_rows), eval_dataset=to_ds(eval_rows),
                             processing_class=tok)
        before = trainer.evaluate()
        trainer.train()
        after = trainer.evaluate()
        log = trainer.state.log_history
    provenance = {**{k: info[k] for k in ("attention", "shift", "block_size", "mask_token_id", "eos_token_id",
                                          "pad_token_id")},
                  "method": "ar_dpo", "base_model": str(model_dir), "domains": domains, "seed": seed, "dpo": cfg,
                  "train_pairs": len(train_rows), "eval_pairs": len(eval_rows),
                  "reward_accuracy_before": before["eval_rewards/accuracies"],
                  "reward_accuracy": after["eval_rewards/accuracies"], "eval_loss": after["eval_loss"],
                  "wall_seconds": round(time.time() - t0, 1), "log": log, "versions": library_versions()}
    save_model(trainer.model, tok, out_dir, provenance)
    return provenance


def _encode_rows(tok, rows, max_length):
    from ..tokenization import encode_pair

    out = []
    for r in rows:
        p, w = encode_pair(tok, r["prompt"], r["chosen"])
        _, l = encode_pair(tok, r["prompt"], r["rejected"])
        p = p[-max(1, max_length - max(len(w), len(l))):]
        out.append((p, w[: max_length - len(p)], l[: max_length - len(p)]))
    return out


def _elbo(model, conv, seqs, n_samples, gen_seed):
    """ELBO of each (prompt, completion) with ``n_samples`` masks drawn from ``gen_seed``: the same
    masks for every model given the same seed (grad flows when the model requires it)."""
    from ..diffusion import forward_aligned, noise, token_nll
    from ..training.data import collate

    ids, valid, plens = (t.to(model.device) for t in collate([(p + c, len(p)) for p, c in seqs for _ in range(n_samples)],
                                                             conv.pad_token_id))
    gen = torch.Generator().manual_seed(gen_seed)
    nb = noise(ids, valid, plens, conv, generator=gen)
    logits, _ = forward_aligned(model, nb, conv)
    per_row = -(token_nll(logits, nb.clean) * nb.weight).sum(1)
    return per_row.view(len(seqs), n_samples).mean(1)


def train_dlm_dpo(model_dir, train_rows: list[dict], eval_rows: list[dict], out_dir, cfg: dict, seed: int,
                  domains: list[str]) -> dict:
    """DPO on a DLM: loss -log sigmoid(beta * ((E_w - E_w_ref) - (E_l - E_l_ref))) with ELBOs E
    under shared masks; AdamW, cosine schedule, same pairs and steps as the AR DPO."""
    from ..training.ar_pretrain import lr_at
    from .gamma import reward_accuracy

    model, tok, info = load_model(model_dir, dtype=torch.float32)
    ref, _, _ = load_model(model_dir, dtype=torch.float32)
    ref.eval().requires_grad_(False)
    conv = Conventions.from_dict(info)
    if not conv.is_diffusion:
        raise ValueError(f"{model_dir} is causal; DLM DPO needs a diffusion model")
    data = _encode_rows(tok, train_rows, cfg["max_length"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    rng = torch.Generator().manual_seed(seed)
    k, bs = cfg["elbo_samples"], cfg["batch_size"]
    before = reward_accuracy(ref, ref, conv, eval_rows, tok, beta=cfg["beta"], n_samples=cfg["eval_elbo_samples"],
                             seed=seed)
    t0, log = time.time(), []
    model.train()
    for step in range(cfg["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg["steps"], cfg["lr"], max(1, cfg["steps"] // 10))
        idx = torch.randint(len(data), (bs,), generator=rng).tolist()
        wins = [(data[i][0], data[i][1]) for i in idx]
        loses = [(data[i][0], data[i][2]) for i in idx]
        s = seed * 1_000_003 + step
        with torch.no_grad():
            ref_w, ref_l = _elbo(ref, conv, wins, k, s), _elbo(ref, conv, loses, k, s + 500_000)
        pol_w, pol_l = _elbo(model, conv, wins, k, s), _elbo(model, conv, loses, k, s + 500_000)
        margin = cfg["beta"] * ((pol_w - ref_w) - (pol_l - ref_l))
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step + 1 == cfg["steps"]:
            log.append({"step": step, "loss": float(loss), "reward_accuracy": float((margin > 0).float().mean())})
    model.eval()
    after = reward_accuracy(model, ref, conv, eval_rows, tok, beta=cfg["beta"], n_samples=cfg["eval_elbo_samples"],
                            seed=seed)
    provenance = {**{k2: info[k2] for k2 in ("attention", "shift", "block_size", "mask_token_id", "eos_token_id",
                                             "pad_token_id")},
                  "method": "dlm_dpo", "base_model": str(model_dir), "domains": domains, "seed": seed, "dpo": cfg,
                  "train_pairs": len(train_rows), "eval_pairs": len(eval_rows),
                  "reward_accuracy_before": before, "reward_accuracy": after,
                  "wall_seconds": round(time.time() - t0, 1), "log": log, "versions": library_versions()}
    save_model(model, tok, out_dir, provenance)
    return provenance
