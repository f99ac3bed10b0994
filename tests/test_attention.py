"""Attention modes on a random small Qwen3, under sdpa and eager."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ar2dlm.core.attention import attention_mask, block_ids, position_ids, two_copy_inputs


@pytest.fixture(params=["sdpa", "eager"])
def model(request):
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    m = Qwen3ForCausalLM(cfg).eval()
    m.set_attn_implementation(request.param)
    return m


def logits(model, ids, mask, pos=None):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def test_causal_mask_matches_default_and_ignores_later_tokens(model):
    ids = torch.randint(0, 64, (2, 12))
    valid = torch.ones_like(ids)
    mask = attention_mask("causal", valid)
    out = logits(model, ids, mask)
    torch.testing.assert_close(out, logits(model, ids, None))
    changed = ids.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 64
    out2 = logits(model, changed, mask)
    torch.testing.assert_close(out2[:, :8], out[:, :8])
    assert not torch.allclose(out2[:, 8:], out[:, 8:])


def test_bidirectional_sees_later_tokens(model):
    ids = torch.randint(0, 64, (2, 12))
    mask = attention_mask("bidirectional", torch.ones_like(ids))
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 64
    assert not torch.allclose(logits(model, ids, mask)[:, :10], logits(model, changed, mask)[:, :10])


def test_block_outputs_ignore_later_blocks_only(model):
    ids = torch.randint(0, 64, (1, 14))
    valid = torch.ones_like(ids)
    plen = torch.tensor([4])  # prompt = block 0 (positions 0-3), then blocks of 4: 4-7, 8-11, 12-13
    assert block_ids(valid, plen, 4).tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3]]
    mask = attention_mask("block", valid, prompt_lens=plen, block_size=4)
    out = logits(model, ids, mask)
    later = ids.clone()
    later[:, 9] = (later[:, 9] + 1) % 64  # a token of block 2
    out2 = logits(model, later, mask)
    torch.testing.assert_close(out2[:, :8], out[:, :8])  # blocks 0-1 ignore it
    assert not torch.allclose(out2[:, 8], out[:, 8])  # its own block sees it (bidirectionally)


def test_padding_is_never_attended(model):
    ids = torch.randint(0, 64, (1, 10))
    padded = torch.cat([torch.full((1, 3), 7), ids], 1)
    valid = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    for mode in ("causal", "bidirectional", "block"):
        kw = {"prompt_lens": torch.tensor([4]), "block_size": 3} if mode == "block" else {}
        ref = logits(model, ids, attention_mask(mode, torch.ones_like(ids), **kw))
        out = logits(model, padded, attention_mask(mode, valid, **kw), position_ids(valid))
        torch.testing.assert_close(out[:, 3:], ref, atol=1e-5, rtol=1e-5)


def test_two_copy_layout_equals_clean_prefix_plus_noisy_block(model):
    torch.manual_seed(1)
    B, T, bs, plen = 2, 14, 4, torch.tensor([2, 2])
    clean = torch.randint(0, 60, (B, T))
    noisy = clean.clone()
    noisy[torch.rand(B, T) < 0.5] = 63  # the mask token
    noisy[:, :2] = clean[:, :2]  # prompt never masked
    valid = torch.ones_like(clean)
    ids, pos, mask = two_copy_inputs(clean, noisy, valid, plen, bs)
    out = logits(model, ids, mask, pos)[:, T:]
    blocks = block_ids(valid, plen, bs)[0]
    for b in range(1, int(blocks.max()) + 1):
        sel = (blocks == b).nonzero().flatten()
        start, end = int(sel[0]), int(sel[-1]) + 1
        direct_ids = torch.cat([clean[:, :start], noisy[:, start:end]], 1)
        direct = logits(
            model, direct_ids, attention_mask("block", torch.ones_like(direct_ids), prompt_lens=plen, block_size=bs)
        )
        torch.testing.assert_close(out[:, start:end], direct[:, start:end], atol=1e-5, rtol=1e-5)


def test_flex_block_mask_matches_dense_two_copy_layout():
    """The flex attention BlockMask route (GPU) gives the dense route's outputs; run here on CPU
    under no_grad, where flex attention supports the forward pass."""
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    m = Qwen3ForCausalLM(cfg).eval()
    clean = torch.randint(0, 60, (2, 16))
    noisy = torch.where(torch.rand(2, 16) < 0.5, torch.full_like(clean, 63), clean)
    valid = torch.ones_like(clean)
    valid[1, 13:] = 0
    plens = torch.tensor([3, 5])
    ids, pos, dense_mask = two_copy_inputs(clean, noisy, valid, plens, 4)
    ref = logits(m, ids, dense_mask, pos)
    m.set_attn_implementation("flex_attention")
    _, _, block_mask = two_copy_inputs(clean, noisy, valid, plens, 4, flex=True)
    out = logits(m, ids, block_mask, pos)
    keep = torch.cat([valid, valid], 1).bool()  # outputs at padding positions are meaningless
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-5, rtol=1e-5)


def test_a_flex_block_mask_is_built_without_the_dense_grid():
    """The 2L layout's BlockMask (the CUDA route) for two rows of 1024 tokens: no allocation on the way is
    as large as the dense (B, 1, 2L, 2L) boolean grid (8 MB; the eager create_block_mask allocates 64 MB)."""
    from torch.profiler import ProfilerActivity, profile

    B, T = 2, 1024
    clean = torch.randint(0, 100, (B, T))
    valid, plens = torch.ones(B, T, dtype=torch.long), torch.tensor([10, 20])
    two_copy_inputs(clean, clean, valid, plens, 32, flex=True)  # compiled once, outside the profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _, _, mask = two_copy_inputs(clean, clean, valid, plens, 32, flex=True)
    assert mask.shape == (B, 1, 2 * T, 2 * T)
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert 0 < largest < B * (2 * T) ** 2, largest
