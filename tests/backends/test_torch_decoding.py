"""The ``torch_decoder`` fast path on a Marian-shaped decoder (SiLU
feed-forward, logits bias, positions in two halves): it serves such a
model on torch and decodes, step by step and through a whole beam search,
as the model's own `Transformer.decode` does. On the other backends the
fast path declines and the same comparisons hold trivially."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_transformer import backends
from keras_transformer.generation.generator import Generator
from keras_transformer.generation.quantization import quantize_model
from tests.helpers import random_batch, tiny_model, to_numpy

# `keras_transformer.marian.model_options` of an OPUS-MT checkpoint,
# shrunk.
_MARIAN_OPTIONS = dict(
    activation="silu",
    use_output_bias=True,
    position_encoding_layout="concatenated",
    scale_embeddings=True,
    layer_norm_epsilon=1e-5,
)


def _marian_model(seed, normalize_first=False):
    """A tiny Marian-shaped model with every weight moved off its initial
    value (biases off zero, scales off one), so that a step that drops or
    swaps one of them computes something else."""
    keras.utils.set_random_seed(seed)
    model = tiny_model(normalize_first=normalize_first, **_MARIAN_OPTIONS)
    rng = np.random.default_rng(seed)
    model.set_weights(
        [
            w + 0.2 * rng.normal(size=w.shape).astype(w.dtype)
            for w in model.get_weights()
        ]
    )
    return model


_models = {flag: _marian_model(3, flag) for flag in (False, True)}


def _step_by_step(model, batch, decode):
    """Logits ``(batch, target_length, V)`` and the stacked cache of
    ``decode`` run one target token at a time, and whether it wrote into
    the cache it was first given."""
    encoder_output = model.encode(
        batch["encoder_token_ids"], batch["encoder_padding_mask"]
    )
    target = batch["decoder_token_ids"]
    cache = model.init_cache(encoder_output, target.shape[1] + 1)
    first = cache["self_attention"]
    logits = []
    for index in range(target.shape[1]):
        step, cache = decode(
            target[:, index : index + 1],
            cache,
            keras.ops.convert_to_tensor(index, "int32"),
            batch["encoder_padding_mask"],
        )
        logits.append(to_numpy(step))
    return (
        np.concatenate(logits, axis=1),
        to_numpy(cache["self_attention"]),
        bool(np.any(to_numpy(first))),
    )


@pytest.mark.parametrize("normalize_first", [False, True])
def test_fast_path_serves_a_marian_decoder(normalize_first, rng):
    """On torch, the fast path computes a SiLU decoder with a logits bias
    (it writes each step into the cache in place, which
    `Transformer.decode` never does), and its logits and cache are those
    of `Transformer.decode` to float32 rounding. Elsewhere it declines."""
    model = _models[normalize_first]
    fast = backends.cached_decoder(model, "stacked")
    served = backends.enabled("torch_decoder")
    assert (fast is not None) == served
    batch = random_batch(rng, 3, 7, 5)
    batch["decoder_padding_mask"][:] = 1
    expected, expected_cache, copied = _step_by_step(model, batch, model.decode)
    assert not copied
    logits, cache, in_place = _step_by_step(model, batch, fast or model.decode)
    assert in_place == served
    assert logits.shape == (3, 5, model.vocabulary_size)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(cache, expected_cache, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the torch_decoder fast path serves torch only: elsewhere both "
    "searches would run the same code",
)
@settings(max_examples=6, deadline=None)
@given(
    st.integers(1, 3),  # sources
    st.integers(1, 9),  # source length
    st.sampled_from([1, 2, 4]),  # beam size
    st.integers(0, 2**31 - 1),  # seed
)
def test_beam_search_through_the_fast_path_is_the_generic_one(
    sources, source_length, beam_size, seed
):
    """A whole search as `Translator.from_pretrained` runs a Marian model
    (Hugging Face's beam search, forced end token): with the fast path
    the same hypotheses, and scores to float32 rounding, as with it
    switched off (`Transformer.decode` with Keras layer calls)."""
    model = _models[seed % 2 == 1]
    batch = random_batch(np.random.default_rng(seed), sources, source_length)
    options = dict(
        method="beam",
        beam_size=beam_size,
        max_length=6,
        length_penalty=1.0,
        length_penalty_style="hf",
        force_end_token=True,
    )
    ids, mask = batch["encoder_token_ids"], batch["encoder_padding_mask"]
    fast = Generator(model).generate(ids, mask, **options)
    with backends.disabled("torch_decoder"):
        plain = Generator(model).generate(ids, mask, **options)
    np.testing.assert_array_equal(fast.token_ids, plain.token_ids)
    np.testing.assert_array_equal(fast.lengths, plain.lengths)
    np.testing.assert_allclose(fast.scores, plain.scores, atol=1e-5)
    np.testing.assert_allclose(fast.log_probs, plain.log_probs, atol=1e-5)
    # Forced end: every hypothesis ends within the limit, with the end id.
    assert np.all((fast.lengths >= 1) & (fast.lengths <= 6))
    last = np.take_along_axis(fast.token_ids, fast.lengths[..., None] - 1, 2)
    assert np.all(last == 3)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the onednn_matmul fast path serves torch's decoder step only",
)
def test_onednn_products_and_their_fallback_decode_alike(monkeypatch, rng):
    """With oneDNN's linear kernel for its products the decoder step
    gives torch.addmm's logits to float32 rounding; where torch lacks that
    kernel it falls back to torch.addmm, with exactly the logits of the
    plain step. The seam asks for oneDNN when ``onednn_matmul`` is on."""
    import torch

    from keras_transformer.backends import torch_decoding

    model = _models[False]
    batch = random_batch(rng, 3, 7, 5)
    batch["decoder_padding_mask"][:] = 1

    def logits(onednn):
        decode = torch_decoding.cached_decoder(model, onednn=onednn)
        return _step_by_step(model, batch, decode)[0]

    expected = logits(False)
    assert torch_decoding.float_product(True) is torch_decoding._onednn_matmul
    np.testing.assert_allclose(logits(True), expected, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert torch_decoding.float_product(True) is torch_decoding._matmul
    np.testing.assert_array_equal(logits(True), expected)
    # The switch: what the seam asks for, with the path on and off.
    asked = []
    monkeypatch.setattr(
        torch_decoding,
        "float_product",
        lambda onednn: asked.append(onednn) or torch_decoding._matmul,
    )
    backends.cached_decoder(model, "stacked")
    with backends.disabled("onednn_matmul"):
        backends.cached_decoder(model, "stacked")
    served = backends.enabled("torch_decoder")
    assert asked == (
        [backends.enabled("onednn_matmul"), False] if served else []
    )


def _int8_model(normalize_first):
    """A copy of the Marian-shaped model, quantized by Keras (every
    projection, the feed-forward kernels and the tied embedding)."""
    source = _models[normalize_first]
    model = type(source).from_config(source.get_config())
    model.set_weights(source.get_weights())
    quantize_model(model, "int8")
    return model


def _skip_without_exact_int8():
    from keras_transformer.backends import torch_decoding

    if not torch_decoding.onednn_int8_is_exact():
        pytest.skip(
            "oneDNN's int8 products are not exact on this CPU (no VNNI), "
            "so the onednn_int8 fast path does not run here"
        )


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the onednn_int8 fast path serves torch's decoder step only",
)
def test_int8_models_are_served_only_where_onednn_int8_is_exact():
    """oneDNN's int8 kernel adds pairs of uint8 x int8 products in 16
    bits on CPUs without VNNI, which overflow for the offset integers the
    fast path gives it. There the path is off and an int8 model decodes
    as Keras computes it; where the products are exact, it is on."""
    import torch

    from keras_transformer.backends import torch_decoding

    integers = torch.full((2, 64), 127)
    weight = torch.full((4, 64), 127, dtype=torch.int8)
    kernel = torch_decoding._Int8Matrix(
        torch.ops.onednn.qlinear_prepack(weight, None),
        torch.ones(4),
        torch.zeros(4, dtype=torch.int32),
    )
    products = torch_decoding._onednn_int8_products(
        (integers + 128).to(torch.uint8), kernel
    )
    exact = bool(torch.all(products == 127 * 127 * 64))
    assert torch_decoding.onednn_int8_is_exact() == exact
    assert backends.enabled("onednn_int8") == exact
    model = _int8_model(False)
    fast = backends.cached_decoder(model, "stacked")
    assert (fast is not None) == exact


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the onednn_int8 fast path serves torch's decoder step only",
)
@pytest.mark.parametrize("normalize_first", [False, True])
def test_int8_step_is_kerass_int8_arithmetic(normalize_first, rng):
    """A model quantized by Keras: with ``onednn_int8`` the fast step
    computes its int8 layers and int8 tied embedding as Keras's int8
    layer calls do (rows quantized per row, integer products, both
    scales divided out), so its logits and cache are those of
    `Transformer.decode` on the int8 model to float32 rounding; with
    the path off, the step declines the model. Packings are made once
    and made again after a kernel is assigned."""
    from keras_transformer.backends import torch_decoding

    _skip_without_exact_int8()
    model = _int8_model(normalize_first)
    assert torch_decoding.cached_decoder(model, int8=False) is None
    fast = torch_decoding.cached_decoder(model, int8=True)
    batch = random_batch(rng, 3, 7, 5)
    batch["decoder_padding_mask"][:] = 1
    expected, expected_cache, _ = _step_by_step(model, batch, model.decode)
    logits, cache, in_place = _step_by_step(model, batch, fast)
    assert in_place
    # Rounding differs in the last bit where a row's integers land on a
    # half; far from the gap to the float model's logits (checked).
    np.testing.assert_allclose(logits, expected, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(cache, expected_cache, atol=1e-4, rtol=1e-4)
    float_logits, _, _ = _step_by_step(
        _models[normalize_first], batch, _models[normalize_first].decode
    )
    assert np.abs(float_logits - expected).max() > 1e-2

    with backends.disabled("onednn_int8"):
        assert backends.cached_decoder(model, "stacked") is None
    embedding = model.decoder_token_embedding
    packed = torch_decoding._int8_matrix(
        embedding.embeddings.value, embedding.embeddings_scale.value
    )
    assert (
        torch_decoding._int8_matrix(
            embedding.embeddings.value, embedding.embeddings_scale.value
        )
        is packed
    )
    embedding.embeddings_scale.assign(2 * to_numpy(embedding.embeddings_scale))
    repacked = torch_decoding.cached_decoder(model, int8=True)
    halved, _, _ = _step_by_step(model, batch, repacked)
    assert not np.allclose(halved, logits, atol=1e-3)
    expected, _, _ = _step_by_step(model, batch, model.decode)
    np.testing.assert_allclose(halved, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the torch_decoder fast path serves torch only",
)
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("stacked", [False, True])
def test_fast_path_encodes_as_the_model(int8, stacked, rng):
    """The fast path's ``init_cache`` (encoder and cross-attention keys
    and values by the same kernels) gives `Transformer.init_cache` of
    `Transformer.encode`, for a float and an int8 model, both layouts,
    with padded sources, less the source columns that are padding in
    every row."""
    from keras_transformer.backends import torch_decoding

    if int8:
        _skip_without_exact_int8()
    model = _int8_model(False) if int8 else _models[False]
    fast = torch_decoding.cached_decoder(model, onednn=True, int8=int8)
    batch = random_batch(rng, 3, 7, 5)
    ids, mask = batch["encoder_token_ids"], batch["encoder_padding_mask"]
    # Two more columns of padding in every row, as a length bucket adds.
    ids, mask = (np.pad(x, [(0, 0), (0, 2)]) for x in (ids, mask))
    assert mask.min() == 0  # some padding
    expected = model.init_cache(model.encode(ids, mask), 9, stacked=stacked)
    cache = fast.init_cache(ids, mask, 9, stacked)
    expected, cache = (
        keras.tree.map_structure(to_numpy, c) for c in (expected, cache)
    )
    keras.tree.assert_same_structure(cache, expected)
    assert np.all(mask[:, 7:] == 0) and np.any(mask[:, 6])
    # The source length axis of the cross-attention cache.
    length_axis = 3 if stacked else 2
    for got, want in zip(
        keras.tree.flatten(cache["cross_attention"]),
        keras.tree.flatten(expected["cross_attention"]),
        strict=True,
    ):
        assert got.shape[length_axis] == 7
        kept = np.take(want, np.arange(7), axis=length_axis)
        np.testing.assert_allclose(got, kept, atol=1e-4, rtol=1e-4)
    for got, want in zip(
        keras.tree.flatten(cache["self_attention"]),
        keras.tree.flatten(expected["self_attention"]),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the torch_decoder fast path serves torch only",
)
@settings(max_examples=8, deadline=None)
@given(
    st.integers(1, 3),  # sources
    st.sampled_from([2, 3, 4]),  # rows per source
    st.booleans(),  # int8
    st.integers(0, 2**31 - 1),  # seed
)
def test_rows_of_a_source_share_its_cross_attention_cache(
    sources, copies, int8, seed
):
    """A step whose cross-attention cache holds one row per source (the
    copies of a source's row next to each other, as a search lays out its
    beams) gives the logits of the same step with that cache repeated
    for every row, which `Transformer.decode` gets."""
    from keras_transformer.backends import torch_decoding

    if int8:
        _skip_without_exact_int8()
    model = _int8_model(False) if int8 else _models[False]
    fast = torch_decoding.cached_decoder(model, onednn=True, int8=int8)
    rng = np.random.default_rng(seed)
    batch = random_batch(rng, sources, 6, 3)
    ids, mask = batch["encoder_token_ids"], batch["encoder_padding_mask"]
    # Columns of padding in every row, which the cache leaves out.
    ids, mask = (np.pad(x, [(0, 0), (0, 3)]) for x in (ids, mask))
    shared = fast.init_cache(ids, mask, 4, False)
    assert shared["cross_attention"][0][0].shape[2] == 6

    def repeated(x):
        return keras.ops.repeat(x, copies, axis=0)

    rows_mask = repeated(mask)
    tokens = rng.integers(4, 53, size=(sources * copies, 1)).astype("int32")

    def step(cross_attention):
        # Zeros of its own for every row: the step writes into them.
        self_attention = tuple(
            tuple(
                keras.ops.zeros((sources * copies,) + tuple(x.shape[1:]))
                for x in pair
            )
            for pair in shared["self_attention"]
        )
        cache = {
            "self_attention": self_attention,
            "cross_attention": cross_attention,
        }
        return to_numpy(fast(tokens, cache, 0, rows_mask)[0])

    once = step(shared["cross_attention"])
    every_row = step(
        keras.tree.map_structure(repeated, shared["cross_attention"])
    )
    np.testing.assert_allclose(once, every_row, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the torch_decoder fast path serves torch only",
)
def test_a_decoder_made_after_an_assignment_computes_the_new_weights(rng):
    """Self-attention's query, key and value kernels are concatenated
    once and kept with their variables; a decoder made after one of them
    is assigned computes the new weights, as `Transformer.decode` does."""
    from keras_transformer.backends import torch_decoding

    source = _models[False]
    model = type(source).from_config(source.get_config())
    model.set_weights(source.get_weights())
    batch = random_batch(rng, 2, 5, 4)
    batch["decoder_padding_mask"][:] = 1
    fast = torch_decoding.cached_decoder(model)
    before, _, _ = _step_by_step(model, batch, fast)
    value = model.decoder_layers[0].self_attention.value_dense
    value.kernel.assign(2 * to_numpy(value.kernel))
    after, _, _ = _step_by_step(
        model, batch, torch_decoding.cached_decoder(model)
    )
    expected, _, _ = _step_by_step(model, batch, model.decode)
    np.testing.assert_allclose(after, expected, atol=1e-5, rtol=1e-5)
    assert np.abs(after - before).max() > 1e-3


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the torch_decoder fast path serves torch only",
)
def test_a_source_of_padding_alone_searches_as_without_the_fast_path(rng):
    """A source that is all padding attends to every column of its batch
    (`attention_mask_of_call`), so the fast path keeps the padding
    columns for its batch: its search, and the others', are those of the
    search without the fast path."""
    model = _models[False]
    batch = random_batch(rng, 3, 5, 3)
    ids, mask = batch["encoder_token_ids"], batch["encoder_padding_mask"]
    ids[1], mask[1] = 0, 0
    options = dict(method="beam", beam_size=2, max_length=5)
    fast = Generator(model).generate(ids, mask, **options)
    with backends.disabled("torch_decoder"):
        plain = Generator(model).generate(ids, mask, **options)
    np.testing.assert_array_equal(fast.token_ids, plain.token_ids)
    np.testing.assert_allclose(fast.scores, plain.scores, atol=1e-5)
