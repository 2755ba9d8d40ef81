"""Attention weights of the model and the translator: masks, row sums,
and that they are the weights the model computes with."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keras import ops

from tests.generation.conftest import SENTENCES
from tests.helpers import tiny_model, to_numpy

KINDS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")


@pytest.fixture(scope="module")
def model():
    # 2 encoder and 3 decoder layers: a mixed-up list fails loudly.
    return tiny_model(num_decoder_layers=3)


# One padded shape, source longer than target, so that compiled ops are
# reused; the real lengths vary inside it.
SOURCE_LENGTH, TARGET_LENGTH, BATCH = 11, 7, 3


def padded_batch(rng, source_lengths, target_lengths):
    def ids_and_mask(lengths, width):
        lengths = np.asarray(lengths)
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype("int32")
        ids = rng.integers(4, 53, size=mask.shape) * mask
        return ids.astype("int32"), mask

    source, source_mask = ids_and_mask(source_lengths, SOURCE_LENGTH)
    target, target_mask = ids_and_mask(target_lengths, TARGET_LENGTH)
    return {
        "encoder_token_ids": source,
        "encoder_padding_mask": source_mask,
        "decoder_token_ids": target,
        "decoder_padding_mask": target_mask,
    }


@pytest.fixture(scope="module")
def batch():
    return padded_batch(np.random.default_rng(1), [11, 4, 7], [3, 7, 5])


def numpy_weights(weights):
    return {k: [to_numpy(w) for w in v] for k, v in weights.items()}


def test_logits_equal_those_of_call(model, batch):
    logits, weights = model.attention_weights(batch)
    expected = to_numpy(model(batch))
    np.testing.assert_allclose(to_numpy(logits), expected, atol=2e-5)
    assert [len(weights[k]) for k in KINDS] == [2, 3, 3]
    shapes = {k: tuple(weights[k][0].shape) for k in KINDS}
    assert shapes == {
        "encoder_self_attention": (3, 4, 11, 11),
        "decoder_self_attention": (3, 4, 7, 7),
        "cross_attention": (3, 4, 7, 11),
    }
    assert all("float32" in str(w.dtype) for k in KINDS for w in weights[k])


def test_logits_equal_those_of_call_pre_norm_untied(batch):
    # The other paths through the stack: final norms, own projection.
    model = tiny_model(
        num_encoder_layers=1,
        num_decoder_layers=1,
        normalize_first=True,
        tie_output_embeddings=False,
    )
    logits, weights = model.attention_weights(batch)
    np.testing.assert_allclose(
        to_numpy(logits), to_numpy(model(batch)), atol=2e-5
    )
    assert [len(weights[k]) for k in KINDS] == [1, 1, 1]


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    source_lengths=st.lists(
        st.integers(1, SOURCE_LENGTH), min_size=BATCH, max_size=BATCH
    ),
    target_lengths=st.lists(
        st.integers(1, TARGET_LENGTH), min_size=BATCH, max_size=BATCH
    ),
    seed=st.integers(0, 2**31 - 1),
)
def test_masks_and_row_sums(model, source_lengths, target_lengths, seed):
    inputs = padded_batch(
        np.random.default_rng(seed), source_lengths, target_lengths
    )
    target_length, batch = TARGET_LENGTH, BATCH
    _, weights = model.attention_weights(inputs)
    weights = numpy_weights(weights)
    source_real = inputs["encoder_padding_mask"].astype(bool)
    target_real = inputs["decoder_padding_mask"].astype(bool)
    future = np.triu(np.ones((target_length, target_length), bool), k=1)
    for kind, keys_real in (
        ("encoder_self_attention", source_real),
        ("decoder_self_attention", target_real),
        ("cross_attention", source_real),
    ):
        for w in weights[kind]:
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
            assert (w >= 0).all()
            # (batch, heads, query, key): padded keys get exactly 0.
            padded = np.broadcast_to(~keys_real[:, None, None, :], w.shape)
            assert (w[padded] == 0.0).all()
            if kind == "decoder_self_attention":
                assert (w[..., future] == 0.0).all()

    # Changing padded tokens, or later target tokens, changes no weight
    # of a real query that may not see them.
    rng = np.random.default_rng(seed + 1)
    changed = {k: v.copy() for k, v in inputs.items()}
    for side in ("encoder", "decoder"):
        ids = changed[f"{side}_token_ids"]
        noise = rng.integers(4, 53, size=ids.shape).astype("int32")
        pad = changed[f"{side}_padding_mask"] == 0
        ids[pad] = noise[pad]
    last = target_length - 1
    changed["decoder_token_ids"][:, last] = rng.integers(4, 53, size=batch)
    _, again = model.attention_weights(changed)
    again = numpy_weights(again)
    for kind, real in (
        ("encoder_self_attention", source_real),
        ("cross_attention", target_real),
        ("decoder_self_attention", target_real),
    ):
        for w, v in zip(weights[kind], again[kind], strict=True):
            rows = real.copy()
            if kind != "encoder_self_attention":
                rows[:, last] = False  # the changed last target token
            mask = np.broadcast_to(rows[:, None, :, None], w.shape)
            np.testing.assert_allclose(v[mask], w[mask], atol=1e-5)


def test_weights_reproduce_the_fused_attention_output(model, batch):
    """The returned weights times the value projection, through the
    output projection, give what the layer's fused kernel computes."""
    _, weights = model.attention_weights(batch)

    def embed(side, ids):
        x = getattr(model, f"{side}_token_embedding")(ids)
        return x + getattr(model, f"{side}_position_encoding")(x)

    checks = [
        (
            model.encoder_layers[0].self_attention,
            embed("encoder", batch["encoder_token_ids"]),
            {"key_padding_mask": batch["encoder_padding_mask"]},
            weights["encoder_self_attention"][0],
        ),
        (
            model.decoder_layers[0].self_attention,
            embed("decoder", batch["decoder_token_ids"]),
            {
                "key_padding_mask": batch["decoder_padding_mask"],
                "use_causal_mask": True,
            },
            weights["decoder_self_attention"][0],
        ),
    ]
    for layer, x, masks, w in checks:
        fused = to_numpy(layer(x, **masks))
        # (batch, key, heads, head_dim)
        values = layer.value_dense(x)
        heads = ops.einsum("bnts,bsnh->btnh", w, values)
        recomputed = to_numpy(layer.output_dense(heads))
        np.testing.assert_allclose(recomputed, fused, atol=2e-5)
        # Other weights would give another output: the check can fail.
        flat = ops.ones_like(w) / ops.shape(w)[-1]
        other = to_numpy(
            layer.output_dense(ops.einsum("bnts,bsnh->btnh", flat, values))
        )
        assert np.abs(other - fused).max() > 1e-3


def test_bad_inputs_name_the_problem(model, batch):
    batch = dict(batch)
    del batch["decoder_padding_mask"]
    with pytest.raises(ValueError, match="decoder_padding_mask"):
        model.attention_weights(batch)


# --- the translator


def pieces(tokenizer, text):
    ids = tokenizer.tokenize([text]).to_list()[0]
    return tokenizer.id_to_token(ids)


def test_translator_attention_is_cropped_to_real_tokens(translator):
    tokenizer = translator.tokenizer
    # 9, 3 and 6 source tokens with the end: padded to 16 in the batch;
    # the second alone to 8.
    sources = [f"{SENTENCES[1]} {SENTENCES[4]}", SENTENCES[4], SENTENCES[0]]
    targets = [SENTENCES[4], SENTENCES[3], SENTENCES[5]]
    results = translator.attention(sources, targets)
    layers, heads = 2, 2
    for source, target, result in zip(sources, targets, results, strict=True):
        source_pieces = pieces(tokenizer, source)
        target_pieces = pieces(tokenizer, target)
        assert result.source == source and result.translation == target
        assert result.source_tokens == [*source_pieces, "</s>"]
        assert result.target_tokens == ["<s>", *target_pieces]
        assert result.output_tokens == [*target_pieces, "</s>"]
        s, t = len(source_pieces) + 1, len(target_pieces) + 1
        assert result.encoder_self_attention.shape == (layers, heads, s, s)
        assert result.decoder_self_attention.shape == (layers, heads, t, t)
        assert result.cross_attention.shape == (layers, heads, t, s)
        for kind in KINDS:
            # Cropping lost no weight: every row still sums to 1.
            w = getattr(result, kind)
            assert isinstance(w, np.ndarray) and w.dtype == np.float32
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        # The causal mask, exactly.
        future = np.triu(np.ones((t, t), bool), k=1)
        assert (result.decoder_self_attention[..., future] == 0).all()

    # Alone, with less padding, a short sentence gets the same weights.
    alone = translator.attention(sources[1], targets[1])
    for kind in KINDS:
        np.testing.assert_allclose(
            getattr(alone, kind), getattr(results[1], kind), atol=1e-5
        )


def test_translator_attention_of_its_own_translation(translator):
    sentences = [SENTENCES[2], "", SENTENCES[4]]
    results = translator.attention(sentences)
    hypotheses = translator.translate_with_scores(sentences)
    for sentence, result, best in zip(
        sentences, results, hypotheses, strict=True
    ):
        best = best[0]
        assert result.translation == best.text
        expected = translator.tokenizer.id_to_token(best.token_ids)
        assert result.target_tokens == ["<s>", *expected]
        assert result.cross_attention.shape[2:] == (
            len(result.target_tokens),
            len(result.source_tokens),
        )
        if sentence:
            assert len(result.target_tokens) > 1
    # An empty sentence: the end token only, attended with weight 1.
    assert results[1].source_tokens == ["</s>"]
    np.testing.assert_allclose(results[1].cross_attention, 1.0)


def test_translator_attention_bad_targets(translator):
    with pytest.raises(ValueError, match="2 sentences but 1 targets"):
        translator.attention(SENTENCES[:2], [SENTENCES[0]])
    with pytest.raises(TypeError, match="a str for a str"):
        translator.attention(SENTENCES[0], [SENTENCES[1]])
