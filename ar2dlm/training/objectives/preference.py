"""DLM-DPO's objective (method ``dpo``, :mod:`ar2dlm.methods.dpo` declares it): direct preference
optimisation with the frozen reference in the teacher slot."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.attention import position_ids
from ...core.diffusion import forward_aligned, logits_at, noise, selected_nll
from ..objective import Objective


class Preference(Objective):
    """DPO (TRL's default sigmoid loss): -log sigmoid(beta * ((log pi(y_w|x) - log ref(y_w|x)) -
        (log pi(y_l|x) - log ref(y_l|x)))), averaged over pairs, the frozen reference in the teacher
        slot (sharded with the policy when the plan says so). Sequence log-likelihoods: the sum over
        response tokens of a causal model's log-probabilities, or a DLM's ELBO with ``elbo_samples``
        mask draws per row shared by policy and reference (drawn for the whole micro-batch, so they do
        not depend on the number of processes). Full DPO sharded like a conversion: AR-MAP's full-DPO
        option on several GPUs; one process runs TRL's DPOTrainer instead (``ar2dlm.armap.dpo``). It
    takes no added loss terms."""

    needs_teacher = True
    teacher_head = True

    def batches(self, corpus_path, tokenizer, seq_len, micro, seed):
        from ...data.tokenization import encode_pair
        from ...provenance import read_jsonl
        from ..data import PairBatches

        def row(prompt, response):  # cut to seq_len from the end of the response, as TRL's max_length
            p, c = encode_pair(tokenizer, prompt, response)
            return (p + c)[:seq_len], min(len(p), seq_len - 1)

        pairs = [(row(r["prompt"], r["chosen"]), row(r["prompt"], r["rejected"])) for r in read_jsonl(corpus_path)]
        return PairBatches(pairs, micro, seed, tokenizer.pad_token_id)

    def _logps(self, model, ids, valid, plens, noised) -> torch.Tensor:
        """Sequence log-likelihood of each row's response (ELBO for a DLM, averaged over ``noised``)."""
        if not self.conv.is_diffusion:
            idx = position_ids(valid)
            where = (idx >= plens.view(-1, 1)) & valid.bool()
            source = (torch.arange(ids.shape[1], device=ids.device).expand_as(where) - 1).clamp(min=0)
            logits, _ = logits_at(
                model, where, source, ids.shape[1], input_ids=ids, attention_mask=valid, position_ids=idx
            )
            per = -selected_nll(logits, ids[where])
            return torch.zeros(len(ids), device=ids.device, dtype=per.dtype).index_add(0, where.nonzero()[:, 0], per)
        total = 0.0
        for nb in noised:
            logits, _ = forward_aligned(model, nb, self.conv, where=nb.masked)
            per = -selected_nll(logits, nb.clean[nb.masked]) * nb.weight[nb.masked]
            rows = nb.masked.nonzero()[:, 0]
            total = total + torch.zeros(len(ids), device=ids.device, dtype=per.dtype).index_add(0, rows, per)
        return total / len(noised)

    def terms(self, model, reference, mb, step, generator) -> dict:
        pairs = len(mb.ids) // 2
        chosen = mb.rows[mb.rows < pairs]
        if not torch.equal(mb.rows[mb.rows >= pairs], chosen + pairs):
            raise ValueError(f"a micro-batch of {pairs} pairs must divide among {mb.world} processes")
        rows = torch.cat([chosen, chosen + pairs])
        noised = (
            [
                noise(mb.ids, mb.valid, mb.prompt_lens, self.conv, generator=generator).select(rows)
                for _ in range(self.run["preference"]["elbo_samples"])
            ]
            if self.conv.is_diffusion
            else []
        )
        ids, valid, plens = mb.ids[rows], mb.valid[rows], mb.prompt_lens[rows]
        policy = self._logps(model, ids, valid, plens, noised)
        with torch.no_grad():
            ref = self._logps(reference, ids, valid, plens, noised)
        passes = max(1, len(noised)) * valid.sum()
        block = 2 if self.conv.attention == "block" else 1
        self._count(passes, passes * block)  # the reference: the teacher slot's forward on the same layout
        n = len(chosen)
        margin = self.run["preference"]["beta"] * ((policy[:n] - ref[:n]) - (policy[n:] - ref[n:]))
        return {"dpo": -F.logsigmoid(margin.float()).sum() / pairs * mb.world}
