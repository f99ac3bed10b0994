"""Samplers. Autoregressive decoding with a KV cache via ``model.generate`` (the speed baseline);
diffusion samplers build on the same batching and stopping conventions."""

from __future__ import annotations

import torch
from tqdm import tqdm


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, width - len(x):] = torch.tensor(x, dtype=torch.long)
        mask[i, width - len(x):] = 1
    return ids, mask


@torch.no_grad()
def generate_ar(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 16,
                do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0) -> list[list[int]]:
    """Generate continuations of token-id prompts; each result is cut at the first end-of-text."""
    model.eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    torch.manual_seed(seed)
    out: list[list[int]] = []
    for i in tqdm(range(0, len(prompts), batch_size), desc="generate", mininterval=5):
        ids, mask = left_pad(prompts[i:i + batch_size], pad)
        kwargs = {"do_sample": True, "temperature": temperature, "top_p": top_p} if do_sample else {"do_sample": False}
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             eos_token_id=eos, pad_token_id=pad, **kwargs)
        for row in gen[:, ids.shape[1]:].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
    return out
