"""MDLM: masked-diffusion cross-entropy on a bidirectional student, the base objective the other
diffusion methods share (Efficient-DLM's block student, REPR-ALIGN's added alignment term)."""

from __future__ import annotations

from .spec import Method

DIFFUSION = "ar2dlm.training.objectives.diffusion:Diffusion"


METHOD = Method(name="mdlm", objective=DIFFUSION, description="masked diffusion from the AR teacher's weights")
