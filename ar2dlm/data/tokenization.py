"""Tokenizers: a byte-level BPE trained here (tiny/smoke) or a pretrained one (Qwen3), both with a
mask token, and prompt/continuation encoding that never merges across the boundary."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
PAD_TOKEN = "<|pad|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path):
    """Train a byte-level BPE with reserved end-of-text, mask and padding tokens; save a standard
    tokenizer folder that ``AutoTokenizer.from_pretrained`` loads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, MASK_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=1 << 20,
    )
    fast.save_pretrained(str(out_dir))
    return fast


def load_pretrained_tokenizer(name_or_path: str, out_dir: str | Path | None = None):
    """Load a pretrained tokenizer (hub id or local folder) and make sure it has a mask token.

    Qwen3 has no ``[MASK]``: ``<|mask|>`` is added as a special token, which lands at id 151669,
    an unused row of the 151936-row embedding, so the model needs no resize (dllm a2d, SDAR, OPDLM).
    """
    from transformers import AutoTokenizer

    from ..core.models import resolve_pretrained

    # Resolve hub ids through a snapshot first: it fails in about a second offline, where
    # AutoTokenizer would retry for most of a minute.
    local = (
        name_or_path
        if Path(name_or_path).is_dir()
        else resolve_pretrained(name_or_path, None, local_key="`data.tokenizer.path`")
    )
    tok = AutoTokenizer.from_pretrained(local)
    if tok.mask_token is None:
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def encode_pair(tokenizer, prompt: str, completion: str, eos: bool = True) -> tuple[list[int], list[int]]:
    """Token ids of prompt and completion, tokenised separately (a joint encoding merges the
    prompt's final newline into a token the model never sees at generation time)."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    c = tokenizer(completion, add_special_tokens=False)["input_ids"]
    if eos:
        c = c + [tokenizer.eos_token_id]
    return p, c
