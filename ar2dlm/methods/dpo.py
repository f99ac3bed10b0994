"""DLM-DPO: direct preference optimisation with the frozen reference in the teacher slot, the
method AR-MAP's full-DPO baseline trains with on several GPUs (``ar2dlm.armap.dpo``). It reads
preference pairs, not the corpus, so no conversion run of the config names it."""

from __future__ import annotations

from .spec import Method

METHOD = Method(
    name="dpo",
    objective="ar2dlm.training.objectives.preference:Preference",
    teacher="head",
    takes_terms=False,
    defaults={"preference": {"elbo_samples": 1}},
    conversion=False,
    description="DPO on preference pairs against a frozen reference (TRL's sigmoid loss)",
)
