"""DPO with TRL, on the AR teacher and, as AR-MAP's baseline, directly on a DLM.

Both run TRL's ``DPOTrainer`` with the same settings and logging. TRL scores each sequence with a
causal forward (``model(..., labels=..., fused_lm_head=True).log_probs``); ``DLMDPOTrainer``
overrides only that: for a DLM the per-token log-probabilities are the terms of the core Monte
Carlo ELBO (:func:`ar2dlm.core.likelihood.elbo_terms`), whose masks are drawn from a generator
seeded by the training step and the sequences themselves, so the policy and the frozen reference
score each sequence under the same masks. That is VRPO's estimator (LLaDA 1.5): each of the
``elbo_samples`` draws takes its own time and one mask at it (VRPO's optimal allocation), and the
times and masks are shared by policy and reference (its antithetic sampling: the mask noise cancels
in the log-ratio); with ``antithetic`` each mask is drawn with its complement (time t and 1 - t),
VRPO's antithetic pair; VRPO's budget is 8 draws. TRL's DPO loss, optimizer, schedule and metrics
are used as they are. Plain DLM DPO (``objective: plain_dpo``, the ``dlm_plain_dpo`` section), the
estimator VRPO improves on, draws the reference's masks independently of the policy's.

AR-MAP's other DLM baseline, SimPO (``objective: simpo``, the ``dlm_simpo`` section), runs TRL's CPO
trainer with its SimPO loss, ``DLMSimPOTrainer`` replacing only the sequence score by the ELBO
averaged over the completion's tokens (SimPO's length normalisation); it has no reference.

With ``lora`` in the config (the paper preset's default, as AR-MAP's own recipe) TRL trains a peft
LoRA adapter over the frozen weights (bf16 on a GPU), the reference is the policy with its adapter
disabled, and the saved model is the adapter merged in fp32: the preference vector is the merged
LoRA delta. Full DPO of a causal model precomputes the reference log-probabilities (TRL's
``precompute_ref_log_probs``), so no reference copy stays in memory; full DPO of a DLM keeps a frozen
reference, since its ELBO masks change every step.

TRL's run checkpoints every ``checkpoint_every`` steps into ``<out>.train/`` and resumes from the
last checkpoint there (:mod:`ar2dlm.armap.segments`), so a job killed at its time limit, or one
planned in segments (``stop_after_hours``), continues where it stopped.

Full DPO on several GPUs (``train_dpo_sharded``, launched by torchrun like a conversion) runs in the
project's own FSDP2 trainer with the DPO objective (``ar2dlm.training.objectives.preference.Preference``, the method
registry's home of every training objective): policy and frozen reference sharded across the
processes, checkpoints resumable on any number of them; the exported folder carries the same
provenance as TRL's path.

DPO's implicit reward is scored here too (``reward_accuracy``: the share of held-out pairs whose
reward margin against the reference is positive, ELBOs on masks shared by both models): the DPO
runs report it, and AR-MAP's gamma search (:mod:`ar2dlm.armap.gamma`) ranks its merges by it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.conventions import Conventions
from ..core.diffusion import chunked_rows, item_seed
from ..core.likelihood import dlm_elbo, elbo_terms
from ..core.models import load_model, save_model
from ..data.tokenization import encode_pair
from ..provenance import library_versions
from .segments import checkpoint_step, last_checkpoint, publish, run_settings, scored_once, stop_before_limit, work_dir

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class DpoJob:
    """One DPO run: the model folder it starts from (the AR teacher, or a DLM: AR-MAP's direct
    baseline), its training and held-out preference pairs and their domains, the folder it writes, its
    settings (an ``armap.dpo`` or ``armap.dlm_<objective>`` section) and seed, and how it is launched
    (``stop_after_hours``: a segment that stops before the last step writes no result; ``gpus``)."""

    model_dir: Path | str
    train_rows: list[dict]
    eval_rows: list[dict]
    out_dir: Path | str
    cfg: dict
    seed: int
    domains: list[str]
    launch: dict | None = None

    def __post_init__(self):  # None given: no planned launch ({})
        object.__setattr__(self, "launch", self.launch or {})


def scorable(tok, rows: list[dict], max_length: int | None) -> list[dict]:
    """The rows TRL's DPO keeps at ``max_length`` (truncation_mode keep_start): those whose prompt
    leaves room for at least one completion token."""
    if max_length is None:
        return rows
    return [r for r in rows if len(encode_pair(tok, r["prompt"], "", eos=False)[0]) < max_length]


def _keep_start(pair: tuple[list[int], list[int]], max_length: int | None) -> tuple[list[int], list[int]]:
    prompt, completion = pair
    return pair if max_length is None else (prompt, completion[: max_length - len(prompt)])


def encode_pairs(tok, rows, max_length: int | None = None):
    """Token ids of the chosen and the rejected sequences, cut as TRL's DPO collator cuts them: the
    rows :func:`scorable` keeps, prompt plus completion truncated to their first ``max_length``
    tokens (the lengths DPO trained on, and what bounds a forward's memory)."""
    rows = scorable(tok, rows, max_length)
    wins = [_keep_start(encode_pair(tok, r["prompt"], r["chosen"]), max_length) for r in rows]
    loses = [_keep_start(encode_pair(tok, r["prompt"], r["rejected"]), max_length) for r in rows]
    return wins, loses


def scoring_precision(model):
    """bf16 autocast on a GPU over the fp32 weights (the merge is exact in fp32, the forwards run at
    the GPU's bf16 rate); CPUs score in fp32. No cast cache: it would hold a bf16 copy of every
    weight for as long as the context lasts (16 GB at 8B)."""
    if model.device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)


@dataclass(frozen=True)
class PairScoring:
    """How a DLM's preference pairs are scored: the ELBO (``core.likelihood.dlm_elbo``) of each
    response under the DLM's conventions, over ``n_samples`` masked copies (``batch_size`` per
    forward) drawn from ``seed``, so that every model scored with one ``PairScoring`` sees the same
    masks; pairs tokenised with ``tok`` and cut to ``max_length`` (:func:`encode_pairs`)."""

    conv: Conventions
    tok: object
    n_samples: int
    seed: int
    batch_size: int = 32
    max_length: int | None = None

    def elbos(self, model, pairs, offset: int) -> torch.Tensor:
        with scoring_precision(model):
            seed = self.seed + offset
            scored = dlm_elbo(model, self.conv, pairs, n_samples=self.n_samples, seed=seed, batch_size=self.batch_size)
        return torch.tensor([r["elbo"] for r in scored])


def reference_scores(ref, rows: list[dict], scoring: PairScoring) -> tuple:
    """ELBOs of the chosen and the rejected responses under the reference model."""
    wins, loses = encode_pairs(scoring.tok, rows, scoring.max_length)
    return scoring.elbos(ref, wins, 0), scoring.elbos(ref, loses, 1)


def preference_accuracies(margins: torch.Tensor) -> torch.Tensor:
    """Share of pairs (the last dimension) whose reward margin (chosen minus rejected) is positive, a tie
    counting half: a model that prefers neither response (the reference itself, every margin 0) scores
    0.5, as chance does, so a comparison with it cannot pass on a perturbation that carries no preference."""
    return ((margins > 0).float() + 0.5 * (margins == 0).float()).mean(-1)


def preference_accuracy(margins: torch.Tensor) -> float:
    """:func:`preference_accuracies` of one set of pairs."""
    return float(preference_accuracies(margins))


def reward_accuracy(model, rows: list[dict], refs: tuple, beta: float, scoring: PairScoring) -> float:
    """:func:`preference_accuracy` of the implicit reward margins against the reference (``refs``, from
    :func:`reference_scores` with the same ``scoring``: the same masks)."""
    (rw, rl), (mw, ml) = refs, reference_scores(model, rows, scoring)
    return preference_accuracy(beta * (mw - rw) - beta * (ml - rl))


def checkpoint_every(cfg: dict) -> int:
    """Steps between resumable checkpoints (default: one, at the end)."""
    return cfg.get("checkpoint_every") or cfg["steps"]


def _training_args(cfg: dict, seed: int, output_dir: str, gpu: bool | None = None) -> dict:
    """The TrainingArguments both TRL trainers (DPO, CPO for SimPO) take from a section of the
    config: fp32 on CPU, bf16 on GPU (``gpu``: the GPU's settings; default, whether this machine has
    one: a memory trace asks for them on the CPU); ``batch_size`` split into ``grad_accum``
    micro-batches; a resumable checkpoint every ``checkpoint_every`` steps (the last one kept)."""
    gpu = torch.cuda.is_available() if gpu is None else gpu
    accum = cfg.get("grad_accum", 1)
    return dict(
        output_dir=output_dir,
        beta=cfg["beta"],
        max_steps=cfg["steps"],
        learning_rate=cfg["lr"],
        per_device_train_batch_size=cfg["batch_size"] // accum,
        gradient_accumulation_steps=accum,
        per_device_eval_batch_size=cfg["batch_size"] // accum,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, cfg["steps"] // 10),
        max_length=cfg["max_length"],
        logging_steps=10,
        save_strategy="steps",
        save_steps=checkpoint_every(cfg),
        save_total_limit=1,
        eval_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        bf16=gpu,
        seed=seed,
        data_seed=seed,
    )


def dpo_args(cfg: dict, seed: int, output_dir: str, precompute_ref: bool = False, gpu: bool | None = None):
    """TRL's DPOConfig from a dpo section of the config (gradient checkpointing on GPU; ``gpu`` as
    ``_training_args``)."""
    from trl import DPOConfig

    gpu = torch.cuda.is_available() if gpu is None else gpu
    return DPOConfig(
        **_training_args(cfg, seed, output_dir, gpu),
        activation_checkpointing=gpu,
        precompute_ref_log_probs=precompute_ref,
    )


def simpo_args(cfg: dict, seed: int, output_dir: str):
    """TRL's CPOConfig for SimPO (Meng et al. 2024) from a ``dlm_simpo`` section: the length-normalised
    log-likelihood margin against the target margin ``gamma``, no reference, no behaviour-cloning
    term (``cpo_alpha`` 0, as TRL's SimPO recipe)."""
    from trl.experimental.cpo import CPOConfig

    return CPOConfig(
        **_training_args(cfg, seed, output_dir),
        activation_checkpointing=torch.cuda.is_available(),
        remove_unused_columns=False,  # the pairs' collator reads every column
        loss_type="simpo",
        cpo_alpha=0.0,
        simpo_gamma=cfg["gamma"],
    )


def lora_config(lora: dict | None):
    """peft's LoraConfig from the config's ``lora`` section (None: full DPO)."""
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora.get("dropout", 0.0),
        target_modules=lora.get("target_modules", "all-linear"),
        task_type="CAUSAL_LM",
    )


def _dataset(rows):
    from datasets import Dataset

    return Dataset.from_list([{k: r[k] for k in FIELDS} for r in rows])


def _entropy(logits):
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)


class _ElboOutput:
    """What TRL's DPO loss reads from a fused forward, for a DLM: per-token terms aligned to the
    next-token labels (``[:, j]`` scores token j + 1), zero outside the completion; the metrics
    from the logits of masked positions (``logits`` (N, V), in row-major order of ``masked``)."""

    def __init__(self, terms, logits, clean, masked):
        self.log_probs = terms[:, 1:]
        logits = logits.detach()

        def at_masked(v):
            return v.new_zeros(masked.shape).masked_scatter(masked, v)[:, 1:]

        self.entropy = at_masked(chunked_rows(_entropy, logits))  # fp32 in chunks, not an (N, V) fp32 copy
        self.mean_logits = at_masked(logits.mean(-1, dtype=torch.float32))
        self.is_top1 = at_masked(logits.argmax(-1) == clean[masked])
        self.aux_loss = None


def make_trainer(model, ref, tok, conv, job: DpoJob, output_dir: str):
    """TRL's DPOTrainer for a causal model, ``DLMDPOTrainer`` for a DLM (``conv`` says which), or
    with ``objective: simpo`` in ``cfg`` ``DLMSimPOTrainer`` (TRL's CPO trainer, SimPO loss); a
    LoRA adapter when ``cfg`` has ``lora``; with neither LoRA nor ``ref``, a causal model's
    reference log-probabilities are precomputed."""
    from trl import DPOTrainer

    cfg, seed = job.cfg, job.seed
    data = dict(
        train_dataset=_dataset(job.train_rows),
        eval_dataset=_dataset(job.eval_rows),
        processing_class=tok,
        peft_config=lora_config(cfg.get("lora")),
    )
    if not conv.is_diffusion:
        if objective(cfg) != "dpo":
            raise ValueError(f"the AR teacher is DPO'd; {objective(cfg)!r} is a baseline on the DLM")
        precompute = ref is None and not cfg.get("lora")
        return DPOTrainer(model=model, ref_model=ref, args=dpo_args(cfg, seed, output_dir, precompute), **data)
    elbo = dict(conventions=conv, elbo_samples=cfg["elbo_samples"], antithetic=cfg.get("antithetic", False))
    if objective(cfg) == "simpo":
        return _dlm_simpo_trainer_class()(model=model, args=simpo_args(cfg, seed, output_dir), **data, **elbo)
    elbo["shared_masks"] = objective(cfg) == "dpo"
    return _dlm_trainer_class()(model=model, ref_model=ref, args=dpo_args(cfg, seed, output_dir), **data, **elbo)


def objective(cfg: dict) -> str:
    """The preference objective of a DPO section: ``dpo`` (the teacher's, and VRPO's on a DLM),
    ``plain_dpo`` (DLM DPO with the reference's masks drawn apart from the policy's) or ``simpo``
    (the ``dlm_simpo`` baseline); the rule writes it into the settings."""
    return cfg.get("objective", "dpo")


class _ElboScoring:
    """Sequence log-likelihoods of a DLM inside a TRL trainer: the core ELBO's per-token terms on
    ``elbo_samples`` masks (each with its complement when ``antithetic``), drawn from a generator
    seeded by the training step and the sequences themselves, so a policy and its reference score
    the same batch under the same masks; with ``shared_masks`` False (plain DLM DPO) the reference,
    which TRL scores without gradients, draws its masks from another seed than the policy."""

    def __init__(self, *args, conventions, elbo_samples: int, antithetic: bool = False, shared_masks=True, **kwargs):
        super().__init__(*args, **kwargs)  # the TRL trainer's
        self.conv, self.elbo_samples, self.antithetic = conventions, elbo_samples, antithetic
        self.shared_masks = shared_masks

    def _mask_seed(self, input_ids) -> int:
        content = zlib.crc32(input_ids.detach().cpu().numpy().tobytes())
        seed = item_seed(self.args.seed, self.state.global_step) * 4_294_967_311 + content
        # a forward without gradients is the reference's (TRL's compute_ref_log_probs) or an evaluation's
        return seed if self.shared_masks or torch.is_grad_enabled() else seed + 1

    def _elbo(self, model, ids, valid, labels):
        """The ELBO terms of right-padded prompt + completion rows (``labels`` -100 outside the
        completion), and the completion's positions."""
        completion = labels != -100
        plens = (completion.long().cumsum(1) == 0).sum(1)
        gen = torch.Generator().manual_seed(self._mask_seed(ids) % (1 << 63))
        e = elbo_terms(
            model, self.conv, ids, valid, plens, gen, n_samples=self.elbo_samples, complementary=self.antithetic
        )
        return e, completion


def _dlm_trainer_class():
    from trl import DPOTrainer

    class DLMDPOTrainer(_ElboScoring, DPOTrainer):
        """DPO on a DLM: sequence log-likelihoods are ELBOs under masks shared by policy and reference."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            from peft import PeftModel

            # TRL's fused head sits on the base model under a LoRA adapter, and so does this one
            self._add_elbo_head(self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model)
            if self.ref_model is not None:
                self._add_elbo_head(self.ref_model)

        def _add_elbo_head(self, model) -> None:
            fused_forward = model.forward  # TRL's; with fused_lm_head=False it is the model's own forward

            def forward(*args, fused_lm_head=False, labels=None, **kwargs):
                if not fused_lm_head:
                    return fused_forward(*args, labels=labels, **kwargs)
                ids = kwargs["input_ids"]
                e, _ = self._elbo(model, ids, kwargs["attention_mask"], labels)
                return _ElboOutput(e.terms, e.logits, ids, e.masked)

            model.forward = forward

    return DLMDPOTrainer


def _dlm_simpo_trainer_class():
    from trl.experimental.cpo import CPOTrainer

    class DLMSimPOTrainer(_ElboScoring, CPOTrainer):
        """SimPO on a DLM: TRL's CPO trainer with its SimPO loss, whose length-normalised
        log-likelihood of each response is the ELBO over the completion's tokens."""

        def concatenated_forward(self, model, batch):
            """TRL's contract: chosen and rejected average log-likelihoods, their logits (read only
            for the logged means: here the mean logit of each masked token), the behaviour-cloning
            loss (none: ``cpo_alpha`` is 0)."""
            cat = self.concatenated_inputs(batch, padding_value=self.pad_token_id, device=self.accelerator.device)
            ids, valid = cat["concatenated_input_ids"], cat["concatenated_attention_mask"]
            e, completion = self._elbo(model, ids, valid, cat["concatenated_labels"])
            logps = e.terms.sum(1) / completion.sum(1).clamp(min=1)
            n = batch["chosen_labels"].shape[0]
            row = e.masked.nonzero()[:, 0]
            token_logits = e.logits.detach().mean(-1, dtype=torch.float32)
            return logps[:n], logps[n:], token_logits[row < n], token_logits[row >= n], logps.new_zeros(())

    return DLMSimPOTrainer


def train_dpo(job: DpoJob) -> dict:
    """DPO of the model in ``model_dir`` (the AR teacher, or a DLM: AR-MAP's direct baseline) on
    preference pairs; saves an HF folder with the model's conventions and the provenance: TRL's
    log, and the held-out reward accuracy before and after (for a DLM, scored with the core ELBO on
    ``eval_elbo_samples`` masks, as AR-MAP's gamma search scores it). Resumes from the last
    checkpoint of ``<out_dir>.train/``; with ``stop_after_hours`` in ``launch``, a segment that
    stops before the last step returns ``{"stopped_at": step}`` and writes no result."""
    model_dir, cfg, seed, eval_rows = job.model_dir, job.cfg, job.seed, job.eval_rows
    lora = cfg.get("lora")
    gpu = torch.cuda.is_available()
    t0 = time.time()
    work = work_dir(job.out_dir, run_settings(model_dir, cfg, seed, job.train_rows, eval_rows))
    resume = last_checkpoint(work)
    model, tok, conv, info = load_model(model_dir, dtype=torch.bfloat16 if lora and gpu else torch.float32)
    # the reference: the adapter disabled (LoRA), precomputed log-probabilities (full DPO of a causal
    # model) or a frozen copy (full DPO of a DLM); SimPO has none
    ref = (
        load_model(model_dir, dtype=torch.float32).model.eval().requires_grad_(False)
        if conv.is_diffusion and not lora and objective(cfg) != "simpo"
        else None
    )
    if conv.is_diffusion:
        scoring = held_out_scoring(cfg, conv, tok, seed)
        # scored before training, when the policy is still the reference
        refs = scored_once(work / "reference_scores.pt", lambda: reference_scores(model, eval_rows, scoring))

        def score(m):
            return reward_accuracy(m, eval_rows, refs, cfg["beta"], scoring)

        before = scored_once(work / "accuracy_before.pt", lambda: score(model))
        trainer = make_trainer(model, ref, tok, conv, job, str(work))
        if not _train(trainer, cfg, job.launch, t0, resume):
            return {"stopped_at": trainer.state.global_step, "steps": cfg["steps"]}
        trained = _merged(trainer.model)
        after, evaluation = score(trained), None
    else:
        trainer = make_trainer(model, ref, tok, conv, job, str(work))
        before = trainer.evaluate()["eval_rewards/accuracies"]
        if not _train(trainer, cfg, job.launch, t0, resume):
            return {"stopped_at": trainer.state.global_step, "steps": cfg["steps"]}
        evaluation = trainer.evaluate()  # TRL's held-out metrics of the trained policy (loss, log-probabilities)
        after = evaluation["eval_rewards/accuracies"]
        trained = _merged(trainer.model)
    provenance = dpo_provenance(job, conv, before, after)
    provenance |= {"evaluation": evaluation, "resumed_from_step": checkpoint_step(resume)}
    provenance |= {"wall_seconds": round(time.time() - t0, 1), "log": trainer.state.log_history}
    publish(trained, tok, job.out_dir, provenance)
    shutil.rmtree(work)  # the run is complete: its checkpoints resume nothing
    return provenance


def dpo_provenance(job: DpoJob, conv, before: float, after: float) -> dict:
    """What every DPO result records, one process or sharded: the model, its data and its reward
    accuracy before and after (the caller adds how it trained): :func:`preference_accuracy` (a tie
    counts half: 0.5 before training, where the policy is its reference), except a causal model's
    through TRL, which is TRL's ``eval_rewards/accuracies`` (a tie counts 0)."""
    return {
        **conv.to_dict(),
        "method": f"dlm_{objective(job.cfg)}" if conv.is_diffusion else "ar_dpo",
        "base_model": str(job.model_dir),
        "domains": job.domains,
        "seed": job.seed,
        "dpo": job.cfg,
        "train_pairs": len(job.train_rows),
        "eval_pairs": len(job.eval_rows),
        "reward_accuracy_before": before,
        "reward_accuracy": after,
        "versions": library_versions(),
    }


def _train(trainer, cfg: dict, launch: dict, start: float, resume) -> bool:
    """TRL's training from ``resume`` (a checkpoint folder, or None); False when the segment stopped
    before the last step (``launch["stop_after_hours"]`` after ``start``)."""
    if launch.get("stop_after_hours"):
        trainer.add_callback(stop_before_limit(start, launch["stop_after_hours"]))
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return trainer.state.global_step >= cfg["steps"]


def sharded_dpo_run(cfg: dict, conventions: dict, launch: dict) -> dict:
    """The trainer's run settings for full DPO with a dpo section of the config (method ``dpo`` of
    the registry, its defaults where the config is silent): TRL's defaults for the optimisation
    (cosine schedule with 10% warm-up, no weight decay, gradient norm 1.0)."""
    from ..methods.registry import settings

    gpu = torch.cuda.is_available()
    return settings(
        {
            "name": "dpo",
            "method": "dpo",
            "attention": conventions["attention"],
            "shift": conventions["shift"],
            "block_size": conventions["block_size"],
            "preference": {k: cfg[k] for k in ("beta", "elbo_samples") if k in cfg},
            "training": {
                "batch_size": cfg["batch_size"],
                "grad_accum": cfg.get("grad_accum", 1),
                "seq_len": cfg["max_length"],
                "steps": cfg["steps"],
                "lr": cfg["lr"],
                "warmup_steps": max(1, cfg["steps"] // 10),
                "weight_decay": 0.0,
                "grad_clip": 1.0,
                "dtype": "bf16" if gpu else "fp32",
                "checkpoint_every": cfg.get("checkpoint_every", cfg["steps"]),
                "log_every": 10,
                "export_dtype": "fp32",
                "keep_states": 1,
                "activation_checkpointing": launch.get("activation_checkpointing", gpu),
            },
        }
    )


def held_out_scoring(cfg: dict, conv: Conventions, tok, seed: int) -> PairScoring:
    """How a DPO section (``cfg``) scores its held-out pairs: ``eval_elbo_samples`` masks, ``max_length``."""
    return PairScoring(conv, tok, cfg["eval_elbo_samples"], seed, max_length=cfg["max_length"])


def pair_reward_accuracy(model, ref, rows: list[dict], cfg: dict, scoring: PairScoring) -> float:
    """:func:`preference_accuracy` of the held-out pairs' implicit reward margins (policy against
    reference): causal log-likelihoods, or ELBOs on the masks ``scoring`` shares between both models."""
    from ..core.likelihood import ar_loglikelihood

    if scoring.conv.is_diffusion:
        return reward_accuracy(model, rows, reference_scores(ref, rows, scoring), cfg["beta"], scoring)
    tok = scoring.tok
    wins, loses = encode_pairs(tok, rows, cfg["max_length"])

    def score(m, pairs):
        return torch.tensor(ar_loglikelihood(m, pairs, tok.pad_token_id))

    margin = (score(model, wins) - score(ref, wins)) - (score(model, loses) - score(ref, loses))
    return preference_accuracy(cfg["beta"] * margin)


def train_dpo_sharded(job: DpoJob) -> dict | None:
    """Full DPO under torchrun, every process calling this: the trainer's checkpoints go to
    ``<out_dir>.train/`` (a killed job resumes there, on any number of processes), and rank 0 writes
    the final weights to ``out_dir`` with the provenance ``train_dpo`` writes. A segment stopped by
    ``stop_after_hours`` returns ``{"stopped_at": step}`` on every process."""
    from ..core.models import checkpoint_dir, load_conventions
    from ..provenance import read_jsonl, write_jsonl
    from ..training.distributed import barrier, setup
    from ..training.trainer import TrainJob, train_run

    model_dir, cfg, seed = job.model_dir, job.cfg, job.seed
    if cfg.get("lora"):
        raise ValueError("sharded DPO is full DPO: a LoRA adapter trains on one GPU through TRL (train_dpo)")
    if objective(cfg) != "dpo":
        raise ValueError(f"sharded training runs DPO only; {objective(cfg)} trains on one GPU through TRL (train_dpo)")
    pg = setup()  # the process group of the caller's ``distributed.process_group`` (dpo_run), or one process
    world, rank = pg.world, pg.rank
    work = Path(f"{job.out_dir}.train")
    pairs = work / "pairs.jsonl"
    if rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        write_jsonl(pairs, [{k: r[k] for k in FIELDS} for r in job.train_rows])
    barrier(pg)
    conventions = load_conventions(model_dir)
    run = sharded_dpo_run(cfg, conventions, job.launch)
    t0 = time.time()
    info = train_run(
        TrainJob(run, model_dir, pairs, work, seed=seed, preset="", model_name=Path(model_dir).name, launch=job.launch)
    )
    if info["stopped_at"] is not None:  # a segment of a run planned in several: its retry resumes
        return {"stopped_at": info["stopped_at"], "steps": cfg["steps"]}
    if rank != 0:
        return None
    final = checkpoint_dir(work, cfg["steps"])
    model, tok, conv, _ = load_model(final)
    ref = load_model(model_dir).model.eval()
    scoring = held_out_scoring(cfg, conv, tok, seed)
    before, after = (pair_reward_accuracy(m, ref, job.eval_rows, cfg, scoring) for m in (ref, model))
    provenance = dpo_provenance(job, conv, before, after)
    provenance |= {"evaluation": None, "sharded": {"processes": world, "trainer": info}}
    provenance |= {"wall_seconds": round(time.time() - t0, 1), "log": read_jsonl(work / "log.jsonl")}
    save_model(model, tok, job.out_dir, provenance)
    return provenance


def _merged(model):
    """The trained model as plain weights: a LoRA adapter merged in fp32 (bf16 weights plus a small
    delta would round the delta away), else the model itself."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.to(torch.float32).merge_and_unload()
    return model.eval()
