"""Decoding conventions of a checkpoint, read from the JSON beside its weights, never guessed."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ATTENTION_MODES = ("causal", "bidirectional", "block")


def block_misfit(block_size: int | None, length: int, what: str) -> str | None:
    """Why ``block_size`` cannot tile ``length`` positions (``what``: "the sequence length", "the
    generation length", ...), or None when it divides them: the one check of a length against a block."""
    if block_size is None or block_size < 1:
        return f"block size {block_size} cannot tile {what} {length}: it must be a positive integer"
    return f"block size {block_size} does not divide {what} {length}" if length % block_size else None


@dataclass(frozen=True)
class Conventions:
    attention: str  # causal (AR), bidirectional, or block (block-causal with clean context)
    shift: bool  # True: position i-1 predicts token i; False: position i predicts itself
    mask_token_id: int | None
    eos_token_id: int
    pad_token_id: int
    block_size: int | None = None

    def __post_init__(self):
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"unknown attention mode {self.attention!r} (known: {', '.join(ATTENTION_MODES)})")
        if self.attention == "block" and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block attention needs a positive integer block_size, got {self.block_size!r}")
        if self.attention != "causal" and self.mask_token_id is None:
            raise ValueError("a diffusion model needs a mask token: the tokenizer has none (mask_token_id is null)")

    @property
    def is_diffusion(self) -> bool:
        return self.attention != "causal"

    @classmethod
    def from_dict(cls, d: dict) -> Conventions:
        missing = [k for k in ("attention", "shift", "mask_token_id", "eos_token_id", "pad_token_id") if k not in d]
        if missing:
            raise ValueError(f"conventions JSON lacks {', '.join(missing)}")
        return cls(
            attention=d["attention"],
            shift=bool(d["shift"]),
            mask_token_id=d["mask_token_id"],
            eos_token_id=d["eos_token_id"],
            pad_token_id=d["pad_token_id"],
            block_size=d.get("block_size"),
        )

    def to_dict(self) -> dict:
        return asdict(self)
