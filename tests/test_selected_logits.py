"""Logits only where a loss reads them, losses in chunks, and the flex attention route: each gives
what the dense computation gives."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.diffusion import chunked_rows, diffusion_loss, forward_aligned, noise, selected_nll, token_nll
from ar2dlm.training.data import MicroBatch
from ar2dlm.training.objectives.diffusion import Diffusion

MASK, V = 63, 64
CONVS = {
    "bidir": Conventions("bidirectional", False, MASK, 1, 2, None),
    "bidir-shift": Conventions("bidirectional", True, MASK, 1, 2, None),
    "block": Conventions("block", False, MASK, 1, 2, 4),
    "block-shift": Conventions("block", True, MASK, 1, 2, 4),
}


def make_model():
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    return Qwen3ForCausalLM(cfg)


def batch_of(conv, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 60, (3, 16), generator=gen)
    valid = torch.ones_like(ids)
    valid[1, 11:] = 0
    return noise(ids, valid, torch.tensor([3, 0, 5]), conv, generator=gen)


@pytest.mark.parametrize("name", CONVS)
def test_selected_logits_equal_the_dense_ones_and_so_does_the_loss(name):
    conv, model = CONVS[name], make_model().eval()
    batch = batch_of(conv)
    with torch.no_grad():
        dense, _ = forward_aligned(model, batch, conv)
        selected, _ = forward_aligned(model, batch, conv, where=batch.masked)
    assert selected.shape == (int(batch.masked.sum()), V)
    torch.testing.assert_close(selected, dense[batch.masked], atol=1e-5, rtol=1e-5)
    reference = (token_nll(dense, batch.clean) * batch.weight).sum() / batch.eligible.sum()
    torch.testing.assert_close(diffusion_loss(selected, batch), reference, atol=1e-5, rtol=1e-5)


def test_chunked_loss_has_the_unchunked_value_and_gradient():
    logits = torch.randn(2500, V, requires_grad=True)
    targets = torch.randint(0, V, (2500,))
    weights = torch.rand(2500)
    (selected_nll(logits, targets) * weights).sum().backward()  # 3 chunks of at most 1024 rows
    chunked_grad, logits.grad = logits.grad, None
    reference = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    (reference * weights).sum().backward()
    torch.testing.assert_close(chunked_grad, logits.grad)
    torch.testing.assert_close(chunked_rows(lambda x: x * 2, logits.detach(), chunk=7), logits.detach() * 2)
    # two inputs, one without a gradient (a distillation target): the gradient reaches the other alone
    target, logits.grad = torch.randn(2500, V), None
    kl = chunked_rows(lambda t, x: (t.softmax(-1) * (t.log_softmax(-1) - x.log_softmax(-1))).sum(-1), target, logits)
    kl.sum().backward()
    chunked_grad, logits.grad = logits.grad, None
    (target.softmax(-1) * (target.log_softmax(-1) - logits.log_softmax(-1))).sum().backward()
    torch.testing.assert_close(chunked_grad, logits.grad)


def test_chunked_loss_keeps_one_gradient_of_its_input():
    """At the backward's peak a chunked loss holds its input, one gradient of it and one chunk's fp32
    transients, not a whole-input zero gradient per chunk (what checkpointing slices costs: 4x)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    n, vocab, chunk = 16384, 2048, 1024
    logits = torch.randn(n, vocab, dtype=torch.bfloat16, requires_grad=True)
    tracker = MemTracker()
    tracker.track_external(logits)
    with tracker:
        selected_nll(logits, torch.randint(0, vocab, (n,))).sum().backward()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    assert peak <= 2 * logits.nbytes + 4 * 4 * chunk * vocab, peak / logits.nbytes


@pytest.mark.parametrize("name", ["bidir", "block-shift"])
def test_flex_attention_gives_the_dense_loss(name):
    """The training loss through flex attention BlockMasks (the CUDA route) equals the dense masks'
    (the CPU route). Forward only: flex attention has no CPU backward in this torch; the GPU check
    script compares gradients."""
    conv = CONVS[name]
    run = {"positional_beta": 0.0, "masking": "uniform", "loss_weight": "inverse_t", "align": None}
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 60, (4, 16), generator=gen)
    valid = torch.ones_like(ids)
    valid[2, 12:] = 0
    mb = MicroBatch(ids, valid, torch.tensor([2, 0, 4, 1]), torch.arange(4), 1, 0)
    losses = {}
    for impl in ("sdpa", "flex_attention"):
        model = make_model().eval()
        model.set_attn_implementation(impl)
        with torch.no_grad():
            losses[impl] = Diffusion(run, conv, 0).terms(model, None, mb, 0, torch.Generator().manual_seed(7))[
                "diffusion"
            ]
    assert losses["sdpa"] > 0
    torch.testing.assert_close(losses["flex_attention"], losses["sdpa"], atol=1e-5, rtol=1e-5)
