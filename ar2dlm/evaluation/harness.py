"""lm-eval model class ``ar2dlm``: any model this pipeline writes, read with its conventions.

- ``loglikelihood``: exact log-probs for AR models; the core ELBO estimator (a lower bound on
  log p, Monte Carlo with fixed seeds) for DLMs. ``is_greedy`` is exact for AR models; a DLM has
  no left-to-right greedy continuation, so it reports whether every continuation token is the
  argmax when that token alone is masked (one forward per request).
- ``loglikelihood_rolling``: the same, of the whole text after an end-of-text token.
- ``generate_until``: the model's own sampler (AR generation or block decoding), ``batch_size``
  requests at a time (grouped by generation settings, longest prompt first), cut at ``until``. A
  task's own ``max_gen_toks`` is capped at the class's ``max_gen_toks`` (the config's; lm-eval's
  ``aime24`` asks for 32768, past a Base model's context when every step sees the whole canvas).

Use from Python (``lm_eval.simple_evaluate(model=HarnessLM(path), tasks=[...])``) or, once this
module is imported, ``lm_eval --model ar2dlm --model_args pretrained=<model dir>``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from ..core.engine import generate
from ..core.likelihood import ar_scores, dlm_elbo
from ..core.models import load_model
from ..core.sampling import Decoding


@register_model("ar2dlm")
class HarnessLM(LM):
    MAX_GEN_TOKS = 256  # lm-eval's own default for a model class

    def __init__(
        self,
        pretrained: str,
        batch_size: int | str = 16,
        elbo_samples: int = 32,
        threshold: float = 0.9,
        steps_per_block: int | None = None,
        block_size: int | None = None,
        max_gen_toks: int = MAX_GEN_TOKS,
        seed: int = 0,
        dtype: torch.dtype | str | None = None,
        device: str = "auto",
        **kwargs,
    ):
        super().__init__()
        if isinstance(dtype, str):  # from lm-eval's model_args, e.g. dtype=bfloat16
            dtype = getattr(torch, dtype)
        self.model, self.tokenizer, self.conv, _ = load_model(pretrained, dtype=dtype, device=device)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16
        # lm-eval hands its model_args over as flat keywords (strings from the command line): read once here
        self.elbo_samples, self.seed = int(elbo_samples), int(seed)
        self.decoding = Decoding(
            max_new_tokens=0,  # each request's own
            block_size=int(block_size) if block_size not in (None, "None") else None,
            threshold=float(threshold),
            steps_per_block=int(steps_per_block) if steps_per_block not in (None, "None") else None,
            seed=self.seed,
        )
        self.max_gen_toks = int(max_gen_toks)
        self.path = pretrained

    @property
    def tokenizer_name(self) -> str:
        return self.path

    def _encode(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # lm-eval convention: trailing whitespace of the context belongs to the continuation
        n = len(context) - len(context.rstrip())
        context, continuation = context[: len(context) - n], context[len(context) - n :] + continuation

        def enc(s):
            return self.tokenizer(s, add_special_tokens=False)["input_ids"] if s else []

        ctx = enc(context) or [self.conv.eos_token_id]
        return ctx, enc(continuation)

    def _score(self, pairs) -> list[tuple[float, bool]]:
        if not self.conv.is_diffusion:
            return ar_scores(self.model, pairs, self.conv.pad_token_id, self.batch_size)
        elbos = dlm_elbo(
            self.model, self.conv, pairs, n_samples=self.elbo_samples, seed=self.seed, batch_size=self.batch_size
        )
        return [(r["elbo"], self._dlm_greedy(p, c)) for r, (p, c) in zip(elbos, pairs)]

    @torch.no_grad()
    def _dlm_greedy(self, prompt: list[int], cont: list[int]) -> bool:
        """Whether each continuation token is the argmax when it alone is masked (one row per token)."""
        from ..core.diffusion import NoisedBatch, forward_aligned

        n, dev = len(cont), self.model.device
        clean = torch.tensor([prompt + cont] * n, device=dev)
        rows, cols = torch.arange(n, device=dev), len(prompt) + torch.arange(n, device=dev)
        masked = torch.zeros_like(clean, dtype=torch.bool)
        masked[rows, cols] = True
        noisy = clean.masked_fill(masked, self.conv.mask_token_id)
        ones = torch.ones_like(clean)
        batch = NoisedBatch(
            clean, noisy, masked, masked.float(), masked, ones, torch.full((n,), len(prompt), device=dev), ones.float()
        )
        logits, _ = forward_aligned(self.model, batch, self.conv)
        return bool((logits[rows, cols].argmax(-1) == clean[rows, cols]).all())

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self._score([self._encode(*r.args) for r in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs = [([self.conv.eos_token_id], self._encode("", r.args[0])[1]) for r in requests]
        return [s for s, _ in self._score(pairs)]

    def generation_length(self, kwargs: dict) -> int:
        """Tokens to generate for a request: the task's ``max_gen_toks`` capped at the configured
        one, rounded up to whole decoding blocks for a DLM."""
        n = min(int(kwargs.get("max_gen_toks", self.max_gen_toks)), self.max_gen_toks)
        block = self.conv.block_size or self.decoding.block_size
        return -(-n // block) * block if self.conv.is_diffusion and block else n

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[tuple[int, float], list] = {}  # one generate call per (length, temperature)
        for i, r in enumerate(requests):
            context, kwargs = r.args
            until = kwargs.get("until") or []
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
            groups.setdefault((self.generation_length(kwargs), temperature), []).append(
                # the whole context, its trailing whitespace too (what a model continues; the loglikelihood
                # convention of _encode gives that whitespace to the scored continuation instead)
                (
                    i,
                    self.tokenizer(context, add_special_tokens=False)["input_ids"] or [self.conv.eos_token_id],
                    [until] if isinstance(until, str) else until,
                )
            )
        limit = getattr(self.model.config, "max_position_embeddings", None)
        out: list[str | None] = [None] * len(requests)
        for (n, temperature), items in groups.items():
            items.sort(key=lambda it: -len(it[1]))  # similar lengths share a batch (less padding)
            if limit and len(items[0][1]) + n > limit:
                raise ValueError(
                    f"a {len(items[0][1])}-token prompt + {n} generated tokens exceeds the model's "
                    f"{limit} positions: lower the benchmark's max_gen_toks"
                )
            decoding = replace(self.decoding, max_new_tokens=n, temperature=temperature)
            ids, _ = generate(self.model, self.conv, [p for _, p, _ in items], decoding, batch_size=self.batch_size)
            for (i, _, until), row in zip(items, ids):
                text = self.tokenizer.decode(row)
                for stop in until:
                    text = text.split(stop)[0]
                out[i] = text
        return out


def evaluate_harness(
    lm: HarnessLM, tasks: list, limit: int | None = None, num_fewshot: int | None = None, seed: int = 0
) -> dict:
    """Run lm-eval tasks (names or config dicts) on ``lm``; returns {task: {metric: value}}."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # whole task configs need no index of lm-eval's tasks (building one parses every task's config)
    manager = TaskManager(include_defaults=False) if all(isinstance(t, dict) for t in tasks) else None
    res = simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=manager,
        limit=limit,
        num_fewshot=num_fewshot,
        log_samples=False,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        bootstrap_iters=0,
    )
    return {
        task: {k.split(",")[0]: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "alias"}
        for task, metrics in res["results"].items()
    }
