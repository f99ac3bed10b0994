"""OPDLM (divelab/OPDLM's public code): on-policy distillation from the frozen AR teacher into a
block-attention student, block 4, no shift."""

from .distillation import DISTILL_DEFAULTS
from .distillation import TERM as DISTILL
from .spec import Method

METHOD = Method(
    name="opdlm",
    objective=DISTILL.objective,
    teacher=DISTILL.teacher,
    defaults={"attention": "block", "block_size": 4, "shift": False, "distill": DISTILL_DEFAULTS},
    requires=("distill",),
    description="on-policy distillation from the frozen AR teacher",
)
