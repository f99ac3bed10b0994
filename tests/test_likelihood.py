"""ELBO estimator and exact AR log-likelihood; diffusion loss sanity."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.diffusion import diffusion_loss, eligible_tokens, forward_aligned, masking_probs, noise
from ar2dlm.core.likelihood import ar_loglikelihood, dlm_elbo, loglikelihood

EOS, PAD, MASK, V = 1, 2, 3, 40


def make_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    return Qwen3ForCausalLM(cfg)


def conv(attention="bidirectional", shift=False, block_size=None):
    return Conventions(attention=attention, shift=shift, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD,
                       block_size=block_size)


PROMPT = [5, 6, 7, 8]
TARGET = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]


@pytest.fixture(scope="module", params=[conv(), conv("block", shift=True, block_size=4)], ids=["bidir", "block-shift"])
def trained(request):
    """A DLM trained for a few dozen steps on one prompt/continuation pair."""
    c = request.param
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.tensor([PROMPT + TARGET] * 16)
    valid, plens = torch.ones_like(ids), torch.tensor([len(PROMPT)] * 16)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        batch = noise(ids, valid, plens, c, generator=gen)
        logits, _ = forward_aligned(model, batch, c, where=batch.masked)
        loss = diffusion_loss(logits, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 / 3  # the diffusion loss falls
    return model.eval(), c


def test_elbo_ranks_trained_continuation_above_shuffled(trained):
    model, c = trained
    shuffled = [TARGET[i] for i in torch.randperm(len(TARGET), generator=torch.Generator().manual_seed(1))]
    good, bad = loglikelihood(model, c, [(PROMPT, TARGET), (PROMPT, shuffled)], n_samples=32)
    assert good > bad + 5


def test_elbo_variance_falls_with_samples(trained):
    model, c = trained
    few = [dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=2, seed=s)[0]["elbo"] for s in range(24)]
    many = [dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=32, seed=s)[0]["elbo"] for s in range(24)]
    assert torch.tensor(many).var() < torch.tensor(few).var() / 4


def test_fixed_seed_is_reproducible_and_complementary_reduces_spread(trained):
    model, c = trained
    a = dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=8, seed=3)
    assert a == dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=8, seed=3)
    plain = [dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=4, seed=s)[0]["elbo"] for s in range(16)]
    anti = [dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=4, seed=s, complementary=True)[0]["elbo"]
            for s in range(16)]
    assert torch.tensor(anti).var() < torch.tensor(plain).var()


def test_ar_loglikelihood_is_exact():
    model = make_model().eval()
    c = conv("causal")
    got = loglikelihood(model, c, [(PROMPT, TARGET), ([9], [4, 4])])
    ids = torch.tensor([PROMPT + TARGET])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits, -1)[0]
    want = sum(float(logp[len(PROMPT) + i - 1, t]) for i, t in enumerate(TARGET))
    assert got[0] == pytest.approx(want, abs=1e-4)
    assert got == pytest.approx(ar_loglikelihood(model, [(PROMPT, TARGET), ([9], [4, 4])], PAD, batch_size=1), abs=1e-4)


def test_noise_never_masks_prompt_or_padding_and_weights_are_inverse_probs():
    ids = torch.arange(20).view(2, 10) + 4
    valid = torch.ones_like(ids)
    valid[1, 8:] = 0
    plens = torch.tensor([3, 5])
    gen = torch.Generator().manual_seed(0)
    for c, beta in ((conv(), 0.0), (conv("block", block_size=4), 2.0), (conv(shift=True), 0.0)):
        for _ in range(20):
            b = noise(ids, valid, plens, c, beta=beta, generator=gen)
            assert not b.masked[0, :3].any() and not b.masked[1, :5].any() and not b.masked[1, 8:].any()
            assert torch.equal(b.noisy[b.masked], torch.full_like(b.noisy[b.masked], MASK))
            torch.testing.assert_close(b.weight[b.masked], 1 / b.prob[b.masked])
    assert not eligible_tokens(valid, torch.zeros(2, dtype=torch.long), shift=True)[:, 0].any()


def test_position_dependent_masking_rises_towards_block_end():
    c = conv("block", block_size=8)
    valid = torch.ones(4000, 16, dtype=torch.long)
    plens = torch.zeros(4000, dtype=torch.long)
    p = masking_probs(valid, plens, c, beta=3.0, eps=1e-3, generator=torch.Generator().manual_seed(0))
    mean = p.mean(0)
    assert all(mean[i] < mean[i + 1] for i in range(7))  # rises inside a block
    assert mean[8] < mean[7]  # and starts low again in the next block
    flat = masking_probs(valid, plens, c, beta=0.0, eps=1e-3, generator=torch.Generator().manual_seed(0)).mean(0)
    assert (flat.max() - flat.min()) < 0.03
