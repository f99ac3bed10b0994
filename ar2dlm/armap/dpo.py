"""DPO with TRL, on the AR teacher and, as AR-MAP's baseline, directly on a DLM.

Both run TRL's ``DPOTrainer`` with the same settings and logging. TRL scores each sequence with a
causal forward (``model(..., labels=..., fused_lm_head=True).log_probs``); ``DLMDPOTrainer``
overrides only that: for a DLM the per-token log-probabilities are the terms of the core Monte
Carlo ELBO (:func:`ar2dlm.core.likelihood.elbo_terms`), whose masks are drawn from a generator
seeded by the training step and the sequences themselves, so the policy and the frozen reference
score each sequence under the same masks (VRPO's variance reduction: the mask noise cancels in the
log-ratio). TRL's DPO loss, optimizer, schedule and metrics are used as they are.
"""

from __future__ import annotations

import tempfile
import time
import zlib

import torch

from ..core.likelihood import elbo_terms
from ..core.models import load_model, save_model
from ..provenance import library_versions

FIELDS = ("prompt", "chosen", "rejected")


def dpo_args(cfg: dict, seed: int, output_dir: str):
    """TRL's DPOConfig from a dpo section of the config (fp32 on CPU, bf16 on GPU)."""
    from trl import DPOConfig

    gpu = torch.cuda.is_available()
    return DPOConfig(output_dir=output_dir, beta=cfg["beta"], max_steps=cfg["steps"], learning_rate=cfg["lr"],
                     per_device_train_batch_size=cfg["batch_size"], per_device_eval_batch_size=cfg["batch_size"],
                     lr_scheduler_type="cosine", warmup_steps=max(1, cfg["steps"] // 10),
                     max_length=cfg["max_length"], logging_steps=10, save_strategy="no", eval_strategy="no",
                     report_to=[], use_cpu=not gpu, bf16=gpu, seed=seed, data_seed=seed)


def _dataset(rows):
    from datasets import Dataset

    return Dataset.from_list([{k: r[k] for k in FIELDS} for r in rows])


class _ElboOutput:
    """What TRL's DPO loss reads from a fused forward, for a DLM: per-token terms aligned to the
    next-token labels (``[:, j]`` scores token j + 1), zero outside the completion."""

    def __init__(self, terms, logits, clean, masked):
        self.log_probs = terms[:, 1:]
        logp = torch.log_softmax(logits.detach().float(), -1)
        self.entropy = (-(logp.exp() * logp).sum(-1) * masked)[:, 1:]
        self.mean_logits = (logits.detach().float().mean(-1) * masked)[:, 1:]
        self.is_top1 = ((logits.detach().argmax(-1) == clean) & masked.bool())[:, 1:]
        self.aux_loss = None


def make_trainer(model, ref, tok, conv, train_rows, eval_rows, cfg, seed, output_dir):
    """TRL's DPOTrainer for a causal model, ``DLMDPOTrainer`` for a DLM (``conv`` says which)."""
    from trl import DPOTrainer

    cls = DPOTrainer if not conv.is_diffusion else _dlm_trainer_class()
    kwargs = {} if not conv.is_diffusion else {"conventions": conv, "elbo_samples": cfg["elbo_samples"]}
    return cls(model=model, ref_model=ref, args=dpo_args(cfg, seed, output_dir), train_dataset=_dataset(train_rows),
               eval_dataset=_dataset(eval_rows), processing_class=tok, **kwargs)


def _dlm_trainer_class():
    from trl import DPOTrainer

    class DLMDPOTrainer(DPOTrainer):
        """DPO on a DLM: sequence log-likelihoods are ELBOs under masks shared by policy and reference."""

        def __init__(self, *args, conventions, elbo_samples: int, **kwargs):
            super().__init__(*args, **kwargs)
            self.conv, self.elbo_samples = conventions, elbo_samples
            for m in (self.model, self.ref_model):
                self._add_elbo_head(m)

        def _mask_seed(self, input_ids) -> int:
            """Seed of the masks of one batch: the training step and the sequences themselves, so the
            policy and the reference draw the same masks for the same batch."""
            content = zlib.crc32(input_ids.detach().cpu().numpy().tobytes())
            return (self.args.seed * 1_000_003 + self.state.global_step) * 4_294_967_311 + content

        def _add_elbo_head(self, model) -> None:
            fused_forward = model.forward  # TRL's; with fused_lm_head=False it is the model's own forward

            def forward(*args, fused_lm_head=False, labels=None, **kwargs):
                if not fused_lm_head:
                    return fused_forward(*args, labels=labels, **kwargs)
                ids, valid = kwargs["input_ids"], kwargs["attention_mask"]
                completion = labels != -100
                plens = (completion.long().cumsum(1) == 0).sum(1)  # rows are right-padded prompt + completion
                gen = torch.Generator().manual_seed(self._mask_seed(ids) % (1 << 63))
                e = elbo_terms(model, self.conv, ids, valid, plens, gen, n_samples=self.elbo_samples)
                return _ElboOutput(e.terms, e.logits, ids, e.masked)

            model.forward = forward

    return DLMDPOTrainer


def train_dpo(model_dir, train_rows: list[dict], eval_rows: list[dict], out_dir, cfg: dict, seed: int,
              domains: list[str]) -> dict:
    """DPO of the model in ``model_dir`` (the AR teacher, or a DLM: AR-MAP's direct baseline) on
    preference pairs; saves an HF folder with the model's conventions and the provenance: TRL's
    log, and the held-out reward accuracy before and after (for a DLM, scored with the core ELBO on
    ``eval_elbo_samples`` masks, as AR-MAP's gamma search scores it)."""
    model, tok, conv, info = load_model(model_dir, dtype=torch.float32)
    ref = load_model(model_dir, dtype=torch.float32).model.eval().requires_grad_(False)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(model, ref, tok, conv, train_rows, eval_rows, cfg, seed, tmp)
        if conv.is_diffusion:
            from .gamma import reward_accuracy

            score = lambda m: reward_accuracy(m, ref, conv, eval_rows, tok, beta=cfg["beta"],  # noqa: E731
                                              n_samples=cfg["eval_elbo_samples"], seed=seed)
            before = score(ref)
            trainer.train()
            model.eval()
            after, eval_loss = score(model), None
        else:
            before = trainer.evaluate()["eval_rewards/accuracies"]
            trainer.train()
            result = trainer.evaluate()
            after, eval_loss = result["eval_rewards/accuracies"], result["eval_loss"]
        log = trainer.state.log_history
    provenance = {**conv.to_dict(), "method": "dlm_dpo" if conv.is_diffusion else "ar_dpo",
                  "base_model": str(model_dir), "domains": domains, "seed": seed, "dpo": cfg,
                  "train_pairs": len(train_rows), "eval_pairs": len(eval_rows),
                  "reward_accuracy_before": before, "reward_accuracy": after, "eval_loss": eval_loss,
                  "wall_seconds": round(time.time() - t0, 1), "log": log, "versions": library_versions()}
    save_model(trainer.model, tok, out_dir, provenance)
    return provenance
