"""Masked-diffusion cross-entropy (method ``mdlm`` and those built on it, :mod:`ar2dlm.methods.mdlm`),
the base objective the other diffusion methods share."""

from __future__ import annotations

from ...core.diffusion import diffusion_loss, forward_aligned, noise
from ..objective import ComposedObjective, StepOutputs, teacher_forward


class Diffusion(ComposedObjective):
    """Masked-diffusion cross-entropy (position-dependent masking when the run asks for it), plus
    the run's added loss terms."""

    def terms(self, model, teacher, mb, step, generator) -> dict:
        run, conv = self.run, self.conv
        beta = run["positional_beta"] if run["masking"] == "positional" else 0.0
        whole = noise(mb.ids, mb.valid, mb.prompt_lens, conv, beta=beta, generator=generator)
        batch = mb.share(whole)
        logits, out = forward_aligned(model, batch, conv, output_hidden_states=self.student_hidden, where=batch.masked)
        terms = {
            "diffusion": diffusion_loss(
                logits, batch, weighted=run["loss_weight"] == "inverse_t", eligible=mb.whole_count(whole.eligible)
            )
            * mb.world
        }

        def clean():
            return teacher_forward(teacher, *mb.local()[:2], hidden=True)

        def count(select):
            return mb.whole_count(select(whole))

        terms |= self.added_terms(StepOutputs(batch, out, clean, count), mb.world)
        tokens = batch.valid.sum()
        self._count(tokens, tokens if self.needs_teacher else 0)
        return terms
