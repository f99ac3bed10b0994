"""Next-token prediction of a causal LM on packed rows: the AR teacher's pretraining objective, run
through the same training loop as the conversion methods (``loop.Loop``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .data import Batches
from .objective import Objective


class PackedEpochs(Batches):
    """Batches of packed rows (``seq_len + 1`` tokens: inputs and next-token targets, every token
    real) in epochs: each epoch a permutation of the rows, drawn in turn from one generator seeded
    with ``seed``, cut into whole batches (an epoch's last rows that fill no batch are left out)."""

    def __init__(self, rows: torch.Tensor, batch_size: int, seed: int):
        if len(rows) < batch_size:
            raise ValueError(f"{len(rows)} packed rows cannot fill one batch of {batch_size}: the corpus is too short")
        self.rows, self.batch_size, self.ordered = rows, batch_size, False
        self._generator, self._epochs = torch.Generator().manual_seed(seed), []

    def _permutation(self, epoch: int) -> torch.Tensor:
        while len(self._epochs) <= epoch:  # drawn in order: epoch e's permutation is the generator's e-th draw
            self._epochs.append(torch.randperm(len(self.rows), generator=self._generator))
        return self._epochs[epoch]

    def whole(self, index: int):
        per_epoch = len(self.rows) // self.batch_size
        start = index % per_epoch * self.batch_size
        ids = self.rows[self._permutation(index // per_epoch)[start : start + self.batch_size]]
        return ids, torch.ones_like(ids), torch.zeros(len(ids), dtype=torch.long)


class CausalLM(Objective):
    """Cross-entropy of each next token, the mean over the whole micro-batch's tokens (every
    process's share of the rows, scaled as the other objectives' terms are)."""

    def batches(self, corpus, tokenizer, seq_len, micro, seed):
        """``corpus``: packed rows of ``seq_len + 1`` tokens (``ar_pretrain.pack_documents``)."""
        if not isinstance(corpus, torch.Tensor) or corpus.ndim != 2 or corpus.shape[1] != seq_len + 1:
            raise ValueError(
                f"the causal-LM objective trains on packed rows of {seq_len + 1} tokens, "
                f"not {type(corpus).__name__} {tuple(getattr(corpus, 'shape', ()))}"
            )
        return PackedEpochs(corpus, micro, seed)

    def terms(self, model, teacher, mb, step, generator) -> dict:
        ids, _, _ = mb.local()
        logits = model(input_ids=ids[:, :-1]).logits
        with torch.autocast(logits.device.type, enabled=False):  # the loss in fp32, as the logits' softmax needs
            flat, targets = logits.float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
            if mb.world == 1:
                loss = F.cross_entropy(flat, targets)
            else:
                loss = F.cross_entropy(flat, targets, reduction="sum") / mb.ids[:, 1:].numel() * mb.world
        self._count(ids[:, :-1].numel())
        return {"lm": loss}

    def trained_tokens(self, mb, step) -> int:
        """Every input position of the whole micro-batch (each predicts the next token)."""
        return int(mb.valid[:, 1:].sum())
