"""AR-MAP's reward-guided gamma search.

For each gamma of a grid, the merged DLM ``W_DLM + gamma * tau_pref`` (tau as is, TIES-trimmed or
DARE-dropped; built tensor by tensor from the model folders) is scored by its batch reward
accuracy on held-out preference pairs: the share of pairs with beta * (log p_merged(y_w|x) -
log p_ref(y_w|x)) > beta * (log p_merged(y_l|x) - log p_ref(y_l|x)), the reference being the DLM
itself (gamma = 0; every margin is 0 there, and a tie counts half, so its accuracy is 0.5, chance).
DLM log-likelihoods are the core ELBO estimator with the same Monte Carlo masks
for every gamma and for the reference (common random numbers), so differences between gammas are
not mask noise. The pairs are split in two: gamma_hat
is the most accurate gamma on the search half (the smallest among ties), and the curve is also
reported on the other half, so a claim about gamma_hat is not judged on the pairs that chose it.

At 8B a pair is scored within one GPU: pairs are cut to DPO's ``max_length`` as TRL's collator cuts
them, only masked positions are projected to the vocabulary, and on a GPU the forwards run in bf16
autocast over the fp32 merge.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .choice import best_point
from .dpo import PairScoring, reference_scores, reward_accuracy, scorable
from .merge import MergeSettings, stream_merge


@dataclass(frozen=True)
class GammaSearch:
    """One search's settings: the gamma grid, the merge and its options, DPO's beta, the ELBO's mask
    draws per pair and masked copies per forward, the seed of its masks (and of the merge's drops), and
    DPO's ``max_length`` the pairs are cut to."""

    grid: tuple[float, ...]
    merge: str
    options: dict
    beta: float
    n_samples: int
    seed: int
    batch_size: int = 32
    max_length: int | None = None

    @classmethod
    def from_config(cls, cfg: dict, merge: str, seed: int) -> GammaSearch:
        """From ``armap.gamma`` (with ``merges``: its merges' options) for ``merge``."""
        return cls(
            grid=tuple(cfg["grid"]),
            merge=merge,
            options=cfg["merges"][merge],
            beta=cfg["beta"],
            n_samples=cfg["elbo_samples"],
            seed=seed,
            batch_size=cfg["batch_size"],
            max_length=cfg.get("max_length"),
        )


@torch.no_grad()
def gamma_search(model, conv, tok, weights: tuple, rows: list[dict], search: GammaSearch) -> dict:
    """The reward-accuracy curve over ``search.grid``; ``model`` (the DLM's architecture) is set to each
    merge ``dlm + gamma * merged(tuned - pre)`` from the folders' weights (``weights``: the DLM's, the
    DPO'd teacher's and the teacher's ``FolderWeights``), one tensor at a time, and ends at gamma_hat.
    Pairs are cut to ``max_length`` as DPO cut them."""
    merge = MergeSettings(search.merge, search.options, search.seed)

    def set_gamma(gamma):
        return stream_merge(model, weights, gamma, merge)

    halves = {"search": rows[0::2], "test": rows[1::2]}
    scoring = PairScoring(conv, tok, search.n_samples, search.seed, search.batch_size, search.max_length)
    set_gamma(0)
    refs = {name: reference_scores(model, part, scoring) for name, part in halves.items()}
    curve = []
    for gamma in search.grid:
        t0 = time.time()
        set_gamma(gamma)
        acc = {name: reward_accuracy(model, part, refs[name], search.beta, scoring) for name, part in halves.items()}
        curve.append(
            {
                "gamma": gamma,
                "reward_accuracy": acc["search"],
                "test_reward_accuracy": acc["test"],
                "seconds": round(time.time() - t0, 2),
            }
        )
    best = best_point(curve)
    set_gamma(best["gamma"])
    return {
        "curve": curve,
        "gamma_hat": best["gamma"],
        "reward_accuracy_at_gamma_hat": best["reward_accuracy"],
        "merge": search.merge,
        "options": search.options,
        "beta": search.beta,
        "elbo_samples": search.n_samples,
        "max_length": search.max_length,
        "search_pairs": len(scorable(tok, halves["search"], search.max_length)),
        "test_pairs": len(scorable(tok, halves["test"], search.max_length)),
    }
