"""OPDLM (divelab/OPDLM's public code): on-policy distillation from the frozen AR teacher into a
block-attention student, block 4, no shift."""

from .distillation import DISTILL_DEFAULTS, Distillation
from .spec import Method

METHOD = Method(
    name="opdlm",
    objective=Distillation,
    defaults={"attention": "block", "block_size": 4, "shift": False, "distill": DISTILL_DEFAULTS},
    requires=("distill",),
    description="on-policy distillation from the frozen AR teacher",
)
