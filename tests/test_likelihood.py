"""ELBO estimator and exact AR log-likelihood; diffusion loss sanity."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.diffusion import (
    collate,
    diffusion_loss,
    eligible_tokens,
    forward_aligned,
    item_seed,
    masking_probs,
    noise,
    token_nll,
)
from ar2dlm.core.likelihood import ar_loglikelihood, dlm_elbo, elbo_terms, loglikelihood

EOS, PAD, MASK, V = 1, 2, 3, 40


def make_model(seed=0):
    torch.manual_seed(seed)
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


def conv(attention="bidirectional", shift=False, block_size=None):
    return Conventions(
        attention=attention, shift=shift, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, block_size=block_size
    )


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
    anti = [
        dlm_elbo(model, c, [(PROMPT, TARGET)], n_samples=4, seed=s, complementary=True)[0]["elbo"] for s in range(16)
    ]
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


def _dense_elbo_terms(model, c, ids, valid, plens, gen, n_samples, complementary):
    """The ELBO terms from full-vocabulary logits at every position (how they were computed before
    only masked positions were projected): the reference the selected-logits path must match."""
    total, count = 0.0, 0
    for _ in range(n_samples):
        batches = [noise(ids, valid, plens, c, generator=gen)]
        if complementary:
            batches.append(noise(ids, valid, plens, c, complement_of=batches[0]))
        for nb in batches:
            logits, _ = forward_aligned(model, nb, c)
            total = total - token_nll(logits, nb.clean) * nb.weight
            count += 1
    return total / count


@pytest.mark.parametrize(
    "c",
    [conv(), conv(shift=True), conv("block", block_size=4), conv("block", shift=True, block_size=4)],
    ids=["bidir", "bidir-shift", "block", "block-shift"],
)
def test_elbo_from_masked_positions_only_equals_the_dense_one(c):
    """Scoring only masked positions (gamma search, DLM DPO) gives the full-logits ELBO terms, their
    gradient and dlm_elbo's numbers on CPU in fp32, to 1e-5 (float32 round-off of a different
    matrix-product blocking; the two agree to about 1e-6 here)."""
    model = make_model(3)
    ids = torch.tensor([PROMPT + TARGET, PROMPT[:2] + TARGET + [4, 4]])
    valid = torch.ones_like(ids)
    valid[1, -2:] = 0
    plens = torch.tensor([len(PROMPT), 2])
    for complementary in (False, True):
        new = elbo_terms(
            model, c, ids, valid, plens, torch.Generator().manual_seed(5), n_samples=3, complementary=complementary
        )
        new.terms.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        old = _dense_elbo_terms(model, c, ids, valid, plens, torch.Generator().manual_seed(5), 3, complementary)
        old.sum().backward()
        torch.testing.assert_close(new.terms, old, atol=1e-5, rtol=1e-5)
        assert (new.terms != 0).any() and new.logits.shape == (int(new.masked.sum()), V)
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-5)
        model.zero_grad()
    pairs = [(PROMPT, TARGET), ([9], TARGET[:5])]
    with torch.no_grad():
        gens = [torch.Generator().manual_seed(item_seed(7, i)) for i in range(2)]
        dense = [
            _dense_elbo_terms(model, c, *(t for t in collate([(p + t, len(p))] * 4, PAD)), g, 1, False).sum(1)
            for (p, t), g in zip(pairs, gens)
        ]
    got = dlm_elbo(model, c, pairs, n_samples=4, seed=7, batch_size=4)
    assert [r["elbo"] for r in got] == pytest.approx([float(d.mean()) for d in dense], abs=1e-5, rel=1e-5)
