"""AR-MAP's reward-guided gamma search.

For each gamma of a grid, the merged DLM ``W_DLM + gamma * tau_pref`` (tau as is, TIES-trimmed or
DARE-dropped) is scored by its batch reward accuracy on held-out preference pairs: the share of
pairs with beta * (log p_merged(y_w|x) - log p_ref(y_w|x)) > beta * (log p_merged(y_l|x) -
log p_ref(y_l|x)), the reference being the DLM itself (gamma = 0). DLM log-likelihoods are the core
ELBO estimator with the same Monte Carlo masks for every gamma and for the reference (common random
numbers), so differences between gammas are not mask noise. The pairs are split in two: gamma_hat
is the most accurate gamma on the search half (the smallest among ties), and the curve is also
reported on the other half, so a claim about gamma_hat is not judged on the pairs that chose it.
"""

from __future__ import annotations

import time

import torch

from ..core.likelihood import dlm_elbo
from ..data.tokenization import encode_pair
from .merge import add_scaled, merged_vector


def _pairs(tok, rows):
    wins = [encode_pair(tok, r["prompt"], r["chosen"]) for r in rows]
    loses = [encode_pair(tok, r["prompt"], r["rejected"]) for r in rows]
    return wins, loses


def _elbos(model, conv, pairs, n_samples, seed, offset):
    return torch.tensor([r["elbo"] for r in dlm_elbo(model, conv, pairs, n_samples=n_samples, seed=seed + offset)])


def reward_accuracy(model, ref, conv, rows: list[dict], tok, *, beta: float, n_samples: int, seed: int,
                    ref_scores: tuple | None = None) -> float:
    wins, loses = _pairs(tok, rows)
    rw, rl = ref_scores if ref_scores is not None else (_elbos(ref, conv, wins, n_samples, seed, 0),
                                                       _elbos(ref, conv, loses, n_samples, seed, 1))
    mw, ml = _elbos(model, conv, wins, n_samples, seed, 0), _elbos(model, conv, loses, n_samples, seed, 1)
    return float((beta * (mw - rw) > beta * (ml - rl)).float().mean())


@torch.no_grad()
def gamma_search(model, conv, tok, base_state: dict, tau: dict, rows: list[dict], *, grid: list[float], merge: str,
                 options: dict, beta: float, n_samples: int, seed: int) -> dict:
    """The reward-accuracy curve over ``grid``; ``model`` holds the DLM and ends at gamma_hat."""
    base_state = {k: v.detach().clone() for k, v in base_state.items()}  # not views of the live weights
    vector = merged_vector(tau, merge, options, seed)
    halves = {"search": rows[0::2], "test": rows[1::2]}
    model.load_state_dict(base_state)
    refs = {}
    for name, part in halves.items():
        wins, loses = _pairs(tok, part)
        refs[name] = (_elbos(model, conv, wins, n_samples, seed, 0), _elbos(model, conv, loses, n_samples, seed, 1))
    curve = []
    for gamma in grid:
        t0 = time.time()
        model.load_state_dict(add_scaled(base_state, vector, gamma))
        acc = {name: reward_accuracy(model, model, conv, part, tok, beta=beta, n_samples=n_samples, seed=seed,
                                     ref_scores=refs[name]) for name, part in halves.items()}
        curve.append({"gamma": gamma, "reward_accuracy": acc["search"], "test_reward_accuracy": acc["test"],
                      "seconds": round(time.time() - t0, 2)})
    best = max(curve, key=lambda r: (r["reward_accuracy"], -r["gamma"]))
    model.load_state_dict(add_scaled(base_state, vector, best["gamma"]))
    return {"curve": curve, "gamma_hat": best["gamma"], "reward_accuracy_at_gamma_hat": best["reward_accuracy"],
            "merge": merge, "options": options, "beta": beta, "elbo_samples": n_samples,
            "search_pairs": len(halves["search"]), "test_pairs": len(halves["test"])}
