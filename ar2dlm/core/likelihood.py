"""Log-likelihood of a continuation given a prompt, behind one interface: exact log-probs for AR
models, a Monte Carlo ELBO (a lower bound on log p) for DLMs.

ELBO: log p(c | x) >= E_mask[ -sum over masked tokens of log p(c_i | x, c_masked) / p_i ], with the
masking schedule of :mod:`ar2dlm.core.diffusion` (one t per block under block attention, so the bound
is the sum of per-block bounds). Masks come from a generator seeded per (seed, item), so two models
scored with the same seed see the same masks (common random numbers, as AR-MAP's gamma search
needs). ``complementary`` pairs each mask with its complement (antithetic sampling).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .conventions import Conventions
from .diffusion import collate, forward_aligned, item_seed, noise, selected_nll
from .sampling import left_pad


@torch.no_grad()
def ar_scores(model, pairs, pad_id: int, batch_size: int = 16) -> list[tuple[float, bool]]:
    """Exact log p(continuation | prompt) of a causal model, and whether greedy decoding from the
    prompt would produce the continuation."""
    out = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        ids, valid = (t.to(model.device) for t in left_pad([p + c for p, c in chunk], pad_id))
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=valid).logits.float(), -1)
        for r, (_p, c) in enumerate(chunk):
            n = len(c)
            target, pred = ids[r, -n:], logp[r, -n - 1 : -1]
            out.append((float(pred.gather(-1, target[:, None]).sum()), bool((pred.argmax(-1) == target).all())))
    return out


def ar_loglikelihood(model, pairs, pad_id: int, batch_size: int = 16) -> list[float]:
    return [s for s, _ in ar_scores(model, pairs, pad_id, batch_size)]


class ElboTerms(NamedTuple):
    terms: torch.Tensor  # (B, T) per-token ELBO terms, mean over draws; their row sum estimates log p
    logits: torch.Tensor  # the last draw's logits at its masked positions (N, V), in row-major order
    masked: torch.Tensor  # the last draw's masked positions (B, T)


def elbo_terms(
    model,
    conv: Conventions,
    ids,
    valid,
    prompt_lens,
    generator,
    *,
    n_samples: int = 1,
    beta: float = 0.0,
    complementary: bool = False,
) -> ElboTerms:
    """The ELBO's per-token terms -log p(c_i | x, c_masked) / p_i on masked completion tokens
    (0 elsewhere), averaged over ``n_samples`` mask draws from ``generator`` (each with its
    complement when ``complementary``). Differentiable: DPO on a DLM trains through it.

    Only masked positions are projected to the vocabulary (``forward_aligned(..., where=masked)``):
    the others weigh 0, and under the 2L layout full-vocabulary logits of every position would be
    the largest tensor of a forward (50 GB for a 2k-token pair at 8B)."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be at least 1, got {n_samples}")
    total, count = 0.0, 0
    for _ in range(n_samples):
        batches = [noise(ids, valid, prompt_lens, conv, beta=beta, generator=generator)]
        if complementary:
            batches.append(noise(ids, valid, prompt_lens, conv, complement_of=batches[0]))
        for nb in batches:
            logits, _ = forward_aligned(model, nb, conv, where=nb.masked)
            nll = selected_nll(logits, nb.clean[nb.masked])
            total = total - torch.zeros_like(nb.weight).masked_scatter(nb.masked, nll) * nb.weight
            count += 1
    return ElboTerms(total / count, logits, nb.masked)


@torch.no_grad()
def dlm_elbo(
    model,
    conv: Conventions,
    pairs,
    n_samples: int = 32,
    seed: int = 0,
    complementary: bool = False,
    beta: float = 0.0,
    batch_size: int = 32,
) -> list[dict]:
    """Monte Carlo ELBO per pair: mean over samples (one row of a batch each), and its standard error."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be at least 1, got {n_samples}")
    results = []
    for idx, (p, c) in enumerate(pairs):
        gen = torch.Generator().manual_seed(item_seed(seed, idx))
        draws = []
        remaining = n_samples
        while remaining > 0:
            k = min(remaining, batch_size)
            ids, valid, plens = (t.to(model.device) for t in collate([(p + c, len(p))] * k, conv.pad_token_id))
            draws.append(
                elbo_terms(model, conv, ids, valid, plens, gen, beta=beta, complementary=complementary).terms.sum(1)
            )
            remaining -= k
        d = torch.cat(draws)
        results.append(
            {
                "elbo": float(d.mean()),
                "stderr": float(d.std() / math.sqrt(len(d))) if len(d) > 1 else float("nan"),
                "n_samples": len(d),
            }
        )
    return results


def loglikelihood(model, conv: Conventions, pairs, **elbo_kwargs) -> list[float]:
    """log p(continuation | prompt): exact for causal models, the ELBO estimate for DLMs."""
    if not conv.is_diffusion:
        return ar_loglikelihood(model, pairs, conv.pad_token_id)
    return [r["elbo"] for r in dlm_elbo(model, conv, pairs, **elbo_kwargs)]
