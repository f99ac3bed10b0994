"""MDLM: masked-diffusion cross-entropy on a bidirectional student, the base objective the other
diffusion methods share (Efficient-DLM's block student, REPR-ALIGN's added alignment term)."""

from __future__ import annotations

from ..core.diffusion import diffusion_loss, forward_aligned, noise
from ..training.objective import teacher_forward
from .spec import ComposedObjective, Method, StepOutputs


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


METHOD = Method(name="mdlm", objective=Diffusion, description="masked diffusion from the AR teacher's weights")
