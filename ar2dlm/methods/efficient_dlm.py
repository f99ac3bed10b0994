"""Efficient-DLM (closest public design: Fast-dLLM v2): block attention with a clean context,
position-dependent masking, no shift, block 32."""

from .mdlm import DIFFUSION
from .spec import Method

METHOD = Method(
    name="efficient_dlm",
    objective=DIFFUSION,
    defaults={"attention": "block", "block_size": 32, "shift": False, "masking": "positional", "positional_beta": 2.0},
    description="masked diffusion on a block-attention student with position-dependent masking",
)
