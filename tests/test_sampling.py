"""Samplers: AR with KV cache, DLM threshold decoding, exact block KV cache."""

from dataclasses import replace

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ar2dlm.core.conventions import Conventions
from ar2dlm.core.engine import generate
from ar2dlm.core.sampling import Decoding, generate_ar, generate_dlm
from tests.shared import GRAPHED

EOS, PAD, MASK, V = 1, 2, 3, 48


class Tok:  # the three ids the samplers need
    eos_token_id, pad_token_id, mask_token_id = EOS, PAD, MASK


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen the random model so that some confidences pass a threshold
        m.lm_head.weight.mul_(40) if not cfg.tie_word_embeddings else m.model.norm.weight.mul_(40)
    return m


def conv(attention="block", shift=False, block_size=4):
    return Conventions(
        attention=attention,
        shift=shift,
        mask_token_id=MASK,
        eos_token_id=EOS,
        pad_token_id=PAD,
        block_size=block_size if attention == "block" else None,
    )


PROMPTS = [[5, 9, 11, 20, 7], [8, 30], [12, 13, 14]]


def greedy_reference(model, prompt, n):
    """Token-by-token argmax without a cache, one prompt at a time."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        if nxt == EOS:
            break
        ids.append(nxt)
    return ids[len(prompt) :]


def test_ar_greedy_batched_with_cache_equals_unbatched_recomputation(model):
    out = generate_ar(model, Tok, PROMPTS, Decoding(12), batch_size=3)
    assert out == [greedy_reference(model, p, 12) for p in PROMPTS]


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("kwargs", [{"threshold": 0.9}, {"threshold": 0.3}, {"steps_per_block": 2, "threshold": None}])
def test_cached_block_decoding_equals_uncached(model, shift, kwargs):
    c = conv(shift=shift)
    cached, s1 = generate_dlm(model, c, PROMPTS, Decoding(16, 4, use_cache=True, **kwargs))
    uncached, s2 = generate_dlm(model, c, PROMPTS, Decoding(16, 4, use_cache=False, **kwargs))
    assert cached == uncached
    assert s1.steps == s2.steps and s1.decoded == s2.decoded


def test_threshold_one_decodes_one_token_per_step(model):
    for c in (conv(), conv("bidirectional")):
        _, stats = generate_dlm(model, c, PROMPTS, Decoding(16, 4, threshold=1.0, use_cache=c.attention == "block"))
        assert stats.steps == stats.decoded and stats.tokens_per_step == 1.0
    _, fast = generate_dlm(model, conv(), PROMPTS, Decoding(16, 4, threshold=0.05))
    assert fast.tokens_per_step > 1.0


def test_fixed_steps_per_block(model):
    _, stats = generate_dlm(model, conv(block_size=8), PROMPTS, Decoding(16, 8, threshold=None, steps_per_block=2))
    assert stats.tokens_per_step == 4.0  # every block of 8 takes exactly 2 steps


def test_an_evaluation_decodes_each_block_in_its_configured_steps(model):
    """The evaluations' entry point: ``steps_per_block`` in place of the threshold, and the statistics
    name which one decoded."""
    bidir = conv("bidirectional")
    _, fixed = generate(model, bidir, PROMPTS, Decoding(16, 8, threshold=0.9, steps_per_block=1), batch_size=2)
    assert fixed["steps_per_block"] == 1 and "threshold" not in fixed
    assert fixed["tokens_per_step"] == 8.0  # a whole block each forward
    _, by_threshold = generate(model, bidir, PROMPTS, Decoding(16, 8, threshold=1.0), batch_size=2)
    assert by_threshold["threshold"] == 1.0 and by_threshold["tokens_per_step"] == 1.0


def test_bad_decoding_inputs_are_named(model):
    with pytest.raises(ValueError, match="block size 5 does not divide the generation length 16"):
        generate_dlm(model, conv(), PROMPTS, Decoding(16, 5))
    with pytest.raises(ValueError, match=r"threshold 1.5 is outside \(0, 1\]"):
        generate_dlm(model, conv(), PROMPTS, Decoding(16, 4, threshold=1.5))
    with pytest.raises(ValueError, match="causal"):
        generate_dlm(model, conv("causal"), PROMPTS, Decoding(16, 4))
    with pytest.raises(ValueError, match="mask token"):
        Conventions(
            attention="block", shift=False, mask_token_id=None, eos_token_id=EOS, pad_token_id=PAD, block_size=4
        )


class EndsAt(torch.nn.Module):
    """The fixture model with end-of-text forced at and after absolute position ``at`` (at it only,
    with ``only``): prompts of different lengths then finish in different blocks."""

    def __init__(self, inner, at, only=False):
        super().__init__()
        self.inner, self.at, self.only, self.rows = inner, at, only, []
        self.config = inner.config

    def forward(self, **kw):
        self.rows.append(kw["input_ids"].shape[0])
        out = self.inner(**kw)
        pos, keep = kw["position_ids"], kw.get("logits_to_keep")
        pos = pos if keep is None else pos[:, -keep:] if isinstance(keep, int) else pos[:, keep]
        out.logits[..., EOS] += 100.0 * ((pos == self.at) if self.only else (pos >= self.at))
        return out


@pytest.mark.parametrize("attention", ["block", "bidirectional"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_finished_rows_leave_the_batch_without_changing_any_row(model, attention, temperature):
    prompts = [[5, 9, 11, 20, 7, 4, 6, 8], [8, 30], [12, 13, 14], [21, 22, 23, 24, 25, 26]]
    m, c = EndsAt(model, at=11), conv(attention)
    decoding = Decoding(24, 4, use_cache=attention == "block", temperature=temperature)
    out, stats = generate_dlm(m, c, prompts, decoding)
    # the long prompt ends in its first block, the two shortest ones in their third: each forward ran
    # the rows still decoding only
    assert [len(o) for o in out] == [3, 9, 8, 5]
    assert set(m.rows) == {4, 3, 2}
    alone = [generate_dlm(m, c, [p], decoding)[0][0] for p in prompts] if temperature == 0 else out
    assert out == alone
    if temperature > 0:  # sampled with one seed per row, each row's tokens are its own whatever the batch
        seeds = [11, 12, 13, 14]
        rows = generate_dlm(m, c, prompts, decoding, row_seeds=seeds)
        each = [generate_dlm(m, c, [p], decoding, row_seeds=[s])[0][0] for p, s in zip(prompts, seeds)]
        assert rows[0] == each
    full, full_stats = generate_dlm(m, c, prompts, replace(decoding, stop_at_eos=False))
    assert stats.steps < full_stats.steps
    if temperature == 0:
        assert [f[: len(o)] for f, o in zip(full, out)] == out


def test_categorical_draws_follow_the_probabilities_and_skip_zeros():
    from ar2dlm.core.sampling import sample_categorical

    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3])
    draws = sample_categorical(probs.expand(40_000, 5).contiguous(), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / len(draws)
    assert freq[0] == freq[2] == 0  # a zero-probability token (the mask token) is never drawn
    assert torch.allclose(freq, probs, atol=0.01)
    big = torch.softmax(torch.randn(3, 151936), -1)  # Qwen3's vocabulary
    rows = sample_categorical(big, torch.Generator().manual_seed(1))
    assert rows.shape == (3,) and (rows < 151936).all()


def test_per_row_generators_draw_each_row_from_its_own_stream():
    from ar2dlm.core.sampling import sample_categorical

    probs = torch.softmax(torch.randn(3, 4, 50), -1)

    def gens():
        return [torch.Generator().manual_seed(s) for s in (5, 6, 7)]

    together = sample_categorical(probs, gens())
    assert torch.equal(together[1:], sample_categorical(probs[1:], gens()[1:]))  # row 0 dropped: the others keep theirs
    assert not torch.equal(together, sample_categorical(probs, [torch.Generator().manual_seed(s) for s in (8, 9, 10)]))


# The decode engine (core/engine.py) against the decoders it replaced: greedy outputs token for
# token, with prompts of three lengths in batches of two (the last batch padded), rows that stop at
# different blocks, and every step kind.
ENGINE_PROMPTS = [[5, 9, 11, 20, 7, 4, 6, 8], [8, 30], [12, 13, 14]]


def test_engine_ar_equals_transformers_generate(model):
    ar = Conventions(attention="causal", shift=True, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD)
    want = generate_ar(model, Tok, ENGINE_PROMPTS, Decoding(12), batch_size=2)
    out, stats = generate(model, ar, ENGINE_PROMPTS, Decoding(12), batch_size=2)
    assert out == want and stats["decoder"] == "ar" and stats["tokens_per_forward"] == 1.0
    # end-of-text forced from the logits at absolute position 12: each row stops there, unchanged before
    out, stats = generate(EndsAt(model, at=12), ar, ENGINE_PROMPTS, Decoding(12), batch_size=2)
    assert out == [w[: 13 - len(p)] for w, p in zip(want, ENGINE_PROMPTS)]
    assert stats["response_tokens"] == sum(map(len, out)) == stats["row_forwards"] - 3  # + the end-of-text steps


@pytest.mark.parametrize("mode", ["block", "block_uncached", "bidirectional"])
@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("kwargs", [{"threshold": 0.9}, {"steps_per_block": 2, "threshold": None}])
def test_engine_dlm_equals_the_dynamic_cache_path(model, mode, shift, kwargs):
    """Full length from the fixture model; to end-of-text (rows stopping in different blocks) from
    the model that ends them."""
    from ar2dlm.core.engine import DecodeEngine

    c, cache = conv(mode.split("_")[0], shift), mode == "block"
    for m, stop in ((model, False), (EndsAt(model, at=11), True)):
        engine = DecodeEngine(m, c)
        for i in (0, 2):
            batch = ENGINE_PROMPTS[i : i + 2]
            decoding = Decoding(24, 4, use_cache=cache, stop_at_eos=stop, **kwargs)
            ref, _ = generate_dlm(m, c, batch, decoding)
            out, st = engine.generate(batch, decoding, batch_size=2)
            assert out == ref, (m, stop, i)
            kinds = {"prefill", "block", "block_first"} if cache else {"canvas"}
            assert set(st.forwards) <= kinds and st.nfe == sum(st.forwards.values())


def test_engine_equals_the_replaced_paths_at_the_tiny_presets_shape():
    """The tiny preset's architecture (random weights, sharpened), AR and every DLM attention mode,
    32 new tokens from prompts of the code suite's lengths."""
    import yaml

    from ar2dlm.core.engine import DecodeEngine
    from tests.conftest import REPO

    arch = yaml.safe_load((REPO / "config" / "presets" / "tiny.yaml").read_text())["models"]["tiny"]["arch"]
    torch.manual_seed(1)
    cfg = Qwen3Config(**arch, vocab_size=1024, head_dim=arch["hidden_size"] // arch["num_attention_heads"])
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.model.norm.weight.mul_(60)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 1024, (n,), generator=gen).tolist() for n in (40, 75)]
    ar = Conventions(attention="causal", shift=True, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD)
    assert DecodeEngine(m, ar).generate(prompts, Decoding(32))[0] == generate_ar(
        m, Tok, prompts, Decoding(32), batch_size=2
    )
    for c, cache in (
        (conv("block", True, 8), True),
        (conv("block", False, 8), False),
        (conv("bidirectional", True), False),
    ):
        decoding = Decoding(32, 8, threshold=0.9, use_cache=cache)
        want, st = generate_dlm(m, c, prompts, decoding)
        assert DecodeEngine(m, c).generate(prompts, decoding)[0] == want
        assert st.response_tokens == 64 and st.tokens_per_step > 1  # full responses, several tokens a step


def test_engine_stops_inside_a_block_and_counts_no_token_after_end_of_text(model):
    """End-of-text decoded at a block's first position with every earlier position filled: the
    engine stops there, where the block-wise path decodes the rest of the block."""
    from ar2dlm.core.engine import DecodeEngine

    prompt = [5, 9, 11, 20, 7]  # response index k sits at absolute position 5 + k
    m, c = EndsAt(model, at=5 + 8, only=True), conv("block", False)
    ref, ref_stats = generate_dlm(m, c, [prompt], Decoding(24, 4, threshold=1.0))
    out, st = DecodeEngine(m, c).generate([prompt], Decoding(24, threshold=1.0))
    assert out == ref and len(out[0]) == 8
    assert st.forwards["block"] + st.forwards["block_first"] == 8 + 1  # one token per step, then end-of-text
    assert ref_stats.nfe - st.nfe == 3  # the reference decodes the three positions after it
    assert st.tokens_per_forward == 8 / st.row_forwards


def test_engine_batch_padding_and_frozen_rows_change_no_row(model):
    from ar2dlm.core.engine import DecodeEngine

    m, c = EndsAt(model, at=11), conv("block", True)
    engine = DecodeEngine(m, c)
    together, st = engine.generate(ENGINE_PROMPTS, Decoding(24), batch_size=4)
    alone = [engine.generate([p], Decoding(24), batch_size=4)[0][0] for p in ENGINE_PROMPTS]
    assert together == alone and set(m.rows) == {4}  # every forward ran the compiled batch shape
    assert st.response_tokens == sum(map(len, together)) and st.row_forwards < st.nfe * 3


def test_bad_engine_inputs_are_named(model):
    from ar2dlm.core.engine import DecodeEngine

    with pytest.raises(ValueError, match="does not divide"):
        DecodeEngine(model, conv("bidirectional")).generate(PROMPTS, Decoding(10, 4, use_cache=False))
    with pytest.raises(ValueError, match="needs block attention"):
        DecodeEngine(model, conv("bidirectional")).generate(PROMPTS, Decoding(8, 4))
    with pytest.raises(ValueError, match="3 prompts for a batch of 2"):
        DecodeEngine(model, conv()).generate(PROMPTS, Decoding(8), batch_size=2)


def test_compiled_engine_equals_eager_and_compiles_each_step_kind_once(model):
    import torch._dynamo

    from ar2dlm.core.engine import DecodeEngine, compile_available

    if not compile_available():
        pytest.skip("torch.compile needs a C++ compiler on a CPU")
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # other tests' compiles counted before
    c = conv("block", True)
    eager, compiled = DecodeEngine(model, c), DecodeEngine(model, c, compile=True)
    for batch in (ENGINE_PROMPTS[:2], ENGINE_PROMPTS[1:]):
        for threshold in (0.9, 0.3):
            want = eager.generate(batch, Decoding(24, threshold=threshold))[0]
            assert compiled.generate(batch, Decoding(24, threshold=threshold))[0] == want
    # three compiled kinds (prefill, block, block_first) at one width bucket: thresholds and prompts never recompile
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 3


@pytest.mark.parametrize("attention, shift, block_size", GRAPHED)
def test_engine_under_cuda_graph_output_lifetimes_decodes_what_the_eager_engine_does(
    model, attention, shift, block_size
):
    """Each step's outputs overwritten as soon as the next step runs (``tests.shared.GraphReplays``, what
    CUDA graph trees do on a GPU): greedy responses token for token those of the eager engine, by
    threshold and in fixed steps, for one prompt and for a padded batch, full length and to end-of-text."""
    from ar2dlm.core.engine import DecodeEngine
    from tests.shared import GraphReplays

    c = Conventions(attention, shift, MASK, EOS, PAD, block_size)
    if attention == "causal":
        decodings = [Decoding(24)]
    else:
        cached, steps = attention == "block", min(2, block_size or 4)
        decodings = [
            Decoding(24, 4, threshold=0.9, use_cache=cached),
            Decoding(24, 4, threshold=None, steps_per_block=steps, use_cache=cached),
        ]
    for m, stop in ((model, False), (EndsAt(model, at=11), True)):
        for decoding in decodings:
            decoding = replace(decoding, stop_at_eos=stop)
            for prompts, batch in (([ENGINE_PROMPTS[0]], 1), (ENGINE_PROMPTS, 4)):
                want = DecodeEngine(m, c).generate(prompts, decoding, batch_size=batch)[0]
                with GraphReplays() as graphs:
                    got = DecodeEngine(m, c).generate(prompts, decoding, batch_size=batch)[0]
                assert got == want, (decoding, batch, stop)
                assert graphs.replays > 1


def test_the_graph_fake_overwrites_a_kept_output_and_refuses_a_cache_a_step_allocates(model):
    from transformers import StaticCache

    from ar2dlm.core.engine import DecodeEngine, EngineStats
    from tests.shared import GraphReplays

    engine = DecodeEngine(model, conv("causal"))
    ids = torch.tensor([[5, 9, 11, 20]])
    pos, mask = torch.arange(4)[None], torch.zeros(1, 1, 4, 4)
    with GraphReplays():
        cache = engine._cache(1, 4)
        first = engine._run("prefill", EngineStats(), ids, pos, mask, cache, 1)
        kept, copied = first[:, :1], first.clone()
        engine._rewind(cache, 0)
        engine._run("prefill", EngineStats(), ids, pos, mask, cache, 1)
        assert kept.isnan().all() and not copied.isnan().any()  # a view of an earlier output is overwritten
        with pytest.raises(RuntimeError, match="early_initialization"):
            engine._run("prefill", EngineStats(), ids, pos, mask, StaticCache(config=model.config, max_cache_len=4), 1)


def test_the_cost_curve_runs_under_cuda_graph_output_lifetimes(model):
    from ar2dlm.evaluation.decode_speed import cost_curve
    from tests.shared import GraphReplays

    with GraphReplays() as graphs:
        curve = cost_curve(model, [1, 8], context=16, repeats=2)
    assert set(curve["ms_per_forward"]) == {"1", "8"} and graphs.replays == 2 * (1 + 3)


def test_one_cache_alive_and_each_step_compiled_once_over_width_buckets_and_calls(model, monkeypatch):
    """Prompts across three width buckets, in mixed order, decoded twice through ``generate``: the
    responses in the prompts' order, at most one KV cache alive at any step, and each step kind compiled
    once per batch width over both calls (``torch.compile`` counted, not run)."""
    import weakref

    from transformers import StaticCache

    from ar2dlm.core.engine import DecodeEngine

    c = conv("block", True)
    prompts = [[5 + i % 7] * n for i, n in enumerate((10, 70, 20, 140, 65, 5))]  # buckets 64 128 64 192 128 64
    want = [DecodeEngine(model, c).generate([p], Decoding(8))[0][0] for p in prompts]
    compiled, caches, alive = [], [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn.__name__) or fn)
    real_init, real_run = StaticCache.__init__, DecodeEngine._run

    def init(self, *args, **kw):
        real_init(self, *args, **kw)
        caches.append(weakref.ref(self))

    def run(self, *args):  # a dropped cache is freed at once (reference counting)
        alive.append(sum(ref() is not None for ref in caches))
        return real_run(self, *args)

    monkeypatch.setattr(StaticCache, "__init__", init)
    monkeypatch.setattr(DecodeEngine, "_run", run)
    for _ in range(2):
        assert generate(model, c, prompts, Decoding(8), batch_size=2, compile=True)[0] == want
        assert not any(ref() for ref in caches)  # none held after a call: the job's next work gets the memory
    assert max(alive) == 1
    # batches by length: (5, 10) at width 64, (20, 65) at 128, (70, 140) at 192; three step kinds each,
    # compiled in the first call; a cache per width and call, each dropped before the next is allocated
    assert len(compiled) == 3 * 3 and len(caches) == 2 * 3
