"""REPR-ALIGN (Open-dLLM's public code): masked diffusion with the alignment term, shift on,
bidirectional attention."""

from .alignment import ALIGN_DEFAULTS
from .mdlm import DIFFUSION
from .spec import Method

METHOD = Method(
    name="repr_align",
    objective=DIFFUSION,
    defaults={"align": ALIGN_DEFAULTS},
    requires=("align",),
    description="masked diffusion plus alignment to the frozen causal teacher's hidden states",
)
