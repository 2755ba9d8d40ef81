"""Every layer: config round trip, .keras save/load, output shape, mixed
precision."""

import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import layers
from tests.helpers import to_numpy

HIDDEN = 32


def make(name):
    return {
        "attention": lambda: layers.MultiHeadAttention(num_heads=4),
        "feed_forward": lambda: layers.PositionwiseFeedForward(64),
        "encoder": lambda: layers.TransformerEncoderLayer(4, 64, dropout=0.1),
        "encoder_pre_norm": lambda: layers.TransformerEncoderLayer(
            4, 64, normalize_first=True
        ),
        "decoder": lambda: layers.TransformerDecoderLayer(4, 64, dropout=0.1),
        "position": lambda: layers.SinusoidalPositionEncoding(64),
        "embedding": lambda: layers.TokenEmbedding(50, HIDDEN),
        "dropout": lambda: layers.Dropout(0.1, seed=3),
    }[name]()


LAYER_NAMES = [
    "attention",
    "feed_forward",
    "encoder",
    "encoder_pre_norm",
    "decoder",
    "position",
    "embedding",
    "dropout",
]


def inputs_for(name, rng):
    if name == "embedding":
        return [rng.integers(0, 50, size=(2, 7)).astype("int32")]
    x = rng.normal(size=(2, 7, HIDDEN)).astype("float32")
    if name == "decoder":
        return [x[:, :5], rng.normal(size=(2, 7, HIDDEN)).astype("float32")]
    return [x]


def expected_shape(name):
    return {
        "position": (1, 7, HIDDEN),
        "decoder": (2, 5, HIDDEN),
    }.get(name, (2, 7, HIDDEN))


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_output_shape_and_config_round_trip(name, rng):
    layer = make(name)
    args = inputs_for(name, rng)
    output = layer(*args)
    assert tuple(output.shape) == expected_shape(name)

    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    clone(*args)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        to_numpy(clone(*args)), to_numpy(output), atol=1e-6
    )


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_keras_file_save_and_load(name, rng, tmp_path):
    args = inputs_for(name, rng)
    symbolic = [
        keras.Input(shape=a.shape[1:], dtype=str(a.dtype), name=f"in_{i}")
        for i, a in enumerate(args)
    ]
    model = keras.Model(symbolic, make(name)(*symbolic))
    path = os.path.join(tmp_path, f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        to_numpy(loaded(args)), to_numpy(model(args)), atol=1e-6
    )


@pytest.mark.parametrize(
    "backend,device,gpu,cpu",
    [
        ("jax", "gpu:0", True, False),
        ("jax", "cpu:0", False, True),
        ("jax", "tpu:0", False, False),
        ("torch", "gpu:0", False, False),
        ("torch", "cpu:0", False, False),
        ("tensorflow", "gpu:0", False, False),
    ],
)
def test_jax_device_checks_read_the_backend_and_first_device(
    backend, device, gpu, cpu, monkeypatch
):
    from keras_transformer import backends

    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: [device])
    backends._first_jax_device.cache_clear()
    try:
        assert backends.broadcast_attention_masks() is gpu
        assert (backends.jax_device_kind() == "cpu") is cpu
    finally:
        backends._first_jax_device.cache_clear()


@pytest.mark.parametrize(
    "masks",
    ["padding", "padding_and_causal", "causal", "none"],
)
def test_gpu_attention_gets_a_mask_per_query(masks, rng, monkeypatch):
    """As on a JAX GPU (this machine has none), the mask that reaches the
    fused attention spans every query, as cuDNN's kernel requires, and
    the output does not change."""
    layer = layers.MultiHeadAttention(num_heads=4)
    query = rng.normal(size=(2, 3, HIDDEN)).astype("float32")
    value = rng.normal(size=(2, 5, HIDDEN)).astype("float32")
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "int32")
    kwargs, want = {
        # Cross-attention over a padded source: (batch, 1, 1, 5) before.
        "padding": (
            {"value": value, "key_padding_mask": padding},
            (2, 1, 3, 5),
        ),
        "padding_and_causal": (
            {"key_padding_mask": padding[:, 2:], "use_causal_mask": True},
            (2, 1, 3, 3),
        ),
        # Causal alone was already (1, 1, 3, 3): left as it is.
        "causal": ({"use_causal_mask": True}, (1, 1, 3, 3)),
        "none": ({}, None),
    }[masks]
    expected = to_numpy(layer(query, **kwargs))

    seen = []
    fused = ops.dot_product_attention

    def attention(q, k, v, mask=None, **options):
        seen.append(None if mask is None else tuple(mask.shape))
        return fused(q, k, v, mask=mask, **options)

    # What `backends.broadcast_attention_masks` decides on a JAX GPU.
    layer._broadcast_masks = True
    monkeypatch.setattr(ops, "dot_product_attention", attention)
    got = to_numpy(layer(query, **kwargs))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert seen == [want]


def test_gpu_attention_mask_builds_in_a_functional_model(rng, monkeypatch):
    """As on a JAX GPU: the broadcast takes unknown batch and lengths
    (building a functional model), and the model computes what the layer
    computes without it."""
    layer = layers.MultiHeadAttention(num_heads=4)
    x = rng.normal(size=(2, 4, HIDDEN)).astype("float32")
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], "int32")
    expected = to_numpy(layer(x, key_padding_mask=mask))
    # What `backends.broadcast_attention_masks` decides on a JAX GPU.
    layer._broadcast_masks = True
    query = keras.Input((None, HIDDEN))
    padding = keras.Input((None,), dtype="int32")
    model = keras.Model(
        [query, padding], layer(query, key_padding_mask=padding)
    )
    assert tuple(model.output.shape) == (None, None, HIDDEN)
    got = to_numpy(model([x, mask]))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("batch,length", [(1, 1), (3, 7), (2, 1)])
def test_head_projections_are_keras_einsum_dense(batch, length, use_bias, rng):
    """The attention projections compute `EinsumDense`'s einsum as a
    tensordot: the same result, at one token and at several."""
    attention = layers.MultiHeadAttention(num_heads=4, use_bias=use_bias)
    attention.build((None, None, HIDDEN))
    attention.set_weights(
        [rng.normal(size=w.shape).astype("float32") for w in attention.weights]
    )
    x = rng.normal(size=(batch, length, HIDDEN)).astype("float32")
    heads = rng.normal(size=(batch, length, 4, HIDDEN // 4)).astype("float32")
    for dense, inputs in (
        (attention.query_dense, x),
        (attention.key_dense, x),
        (attention.value_dense, x),
        (attention.output_dense, heads),
    ):
        assert (dense.bias is not None) == use_bias
        expected = keras.layers.EinsumDense.call(dense, inputs)
        output = dense(inputs)
        assert tuple(output.shape) == tuple(expected.shape)
        np.testing.assert_allclose(
            to_numpy(output), to_numpy(expected), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("name", ["attention", "encoder", "decoder"])
def test_mixed_bfloat16(name, rng):
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = make(name)
    output = layer(*inputs_for(name, rng))
    assert output.dtype == keras.backend.standardize_dtype("bfloat16") or (
        keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    )
    assert all(w.dtype == "float32" for w in layer.weights)
    assert np.isfinite(to_numpy(ops.cast(output, "float32"))).all()


def test_attention_weights_stay_float32_under_mixed_precision(rng):
    keras.config.set_dtype_policy("mixed_bfloat16")
    attention = layers.MultiHeadAttention(num_heads=4)
    x = rng.normal(size=(2, 7, HIDDEN)).astype("float32")
    _, scores = attention(x, return_attention_scores=True)
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(scores).sum(-1), 1.0, atol=1e-6)


def test_sinusoidal_encoding_matches_the_paper():
    layer = layers.SinusoidalPositionEncoding(max_sequence_length=100)
    d = 16
    pe = to_numpy(layer(np.zeros((1, 50, d), "float32")))[0]
    pos = np.arange(50)[:, None]
    i = np.arange(d // 2)[None, :]
    angle = pos / np.power(10000.0, 2 * i / d)
    np.testing.assert_allclose(pe[:, 0::2], np.sin(angle), atol=1e-5)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(angle), atol=1e-5)
    # With a start index, the same table is read further on.
    shifted = to_numpy(layer(np.zeros((1, 3, d), "float32"), start_index=7))
    np.testing.assert_allclose(shifted[0], pe[7:10], atol=1e-5)


def test_concatenated_layout_puts_sines_first():
    layer = layers.SinusoidalPositionEncoding(64, layout="concatenated")
    pe = to_numpy(layer(np.zeros((1, 10, 8), "float32")))[0]
    interleaved = to_numpy(
        layers.SinusoidalPositionEncoding(64)(np.zeros((1, 10, 8), "float32"))
    )[0]
    np.testing.assert_allclose(pe[:, :4], interleaved[:, 0::2], atol=1e-6)
    np.testing.assert_allclose(pe[:, 4:], interleaved[:, 1::2], atol=1e-6)


def test_embedding_is_scaled_and_tied():
    embedding = layers.TokenEmbedding(10, 16)
    ids = np.array([[1, 2, 3]])
    vectors = to_numpy(embedding(ids))
    matrix = to_numpy(embedding.embeddings)
    np.testing.assert_allclose(vectors[0], matrix[[1, 2, 3]] * 4.0, rtol=1e-6)
    logits = to_numpy(embedding(vectors, reverse=True))
    np.testing.assert_allclose(logits, vectors @ matrix.T, rtol=1e-5)


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16), (2, 1, 3, 16)])
def test_output_projection_of_any_rank(shape, rng):
    # Ranks above 2 project as one (rows, hidden_dim) matrix product.
    embedding = layers.TokenEmbedding(10, 16)
    embedding.build()
    x = rng.normal(size=shape).astype("float32")
    logits = to_numpy(embedding(x, reverse=True))
    assert logits.shape == shape[:-1] + (10,)
    expected = x @ to_numpy(embedding.embeddings).T
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    # In a functional graph, known and unknown sizes.
    symbolic = keras.Input((None, 16), batch_size=None)
    assert tuple(embedding(symbolic, reverse=True).shape) == (None, None, 10)
    symbolic = keras.Input((3, 16), batch_size=2)
    assert tuple(embedding(symbolic, reverse=True).shape) == (2, 3, 10)


def test_attention_head_size_is_d_model_over_h():
    attention = layers.MultiHeadAttention(num_heads=8)
    attention(np.zeros((1, 3, 64), "float32"))
    assert attention.head_dim == 8
    # W_i^Q: d_model x h x d_k, W^O: h x d_v x d_model (3.2.2).
    assert tuple(attention.query_dense.kernel.shape) == (64, 8, 8)
    assert tuple(attention.output_dense.kernel.shape) == (8, 8, 64)


def test_sublayers_get_distinct_initial_weights():
    seeded = keras.initializers.GlorotUniform(seed=1)
    attention = layers.MultiHeadAttention(4, kernel_initializer=seeded)
    attention(np.zeros((1, 3, 16), "float32"))
    query = to_numpy(attention.query_dense.kernel)
    key = to_numpy(attention.key_dense.kernel)
    assert not np.allclose(query, key)


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: layers.MultiHeadAttention(6)(np.zeros((1, 2, 512))),
            "num_heads=6 must divide hidden_dim=512",
        ),
        (
            lambda: layers.SinusoidalPositionEncoding(8)(np.zeros((1, 2, 7))),
            "hidden_dim=7 must be even",
        ),
        (
            lambda: layers.SinusoidalPositionEncoding(8)(np.zeros((1, 9, 4))),
            "longer than max_sequence_length=8",
        ),
        (
            lambda: layers.SinusoidalPositionEncoding(8, layout="spiral"),
            "layout='spiral'",
        ),
        (lambda: layers.MultiHeadAttention(0), "num_heads=0"),
        (
            lambda: layers.PositionwiseFeedForward(8, activation_dropout=1.5),
            "activation_dropout=1.5",
        ),
    ],
)
def test_bad_arguments_name_the_value(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("scores", [False, True], ids=["fused", "weights"])
def test_split_and_stacked_caches_attend_alike(scores, rng, monkeypatch):
    """Self- and cross-attention steps on a split cache (keys and values
    apart, heads first) give the stacked cache's outputs, weights, keys
    and values, with padding, causal and per-query masks; one query takes
    the matrix-vector path, unless the weights are requested."""
    one_query = _count_calls(monkeypatch, "_one_query_attention")
    attention = layers.MultiHeadAttention(num_heads=4)
    memory = rng.normal(size=(2, 6, HIDDEN)).astype("float32")
    padding = np.array([[1] * 6, [1] * 3 + [0] * 3], "int32")
    allowed = np.array([[[1, 0, 1, 1, 0, 1]], [[0, 1, 1, 1, 1, 1]]], "int32")
    steps = rng.normal(size=(2, 3, HIDDEN)).astype("float32")
    attention(steps, memory, key_padding_mask=padding)
    cross = {
        stacked: attention.compute_key_value_cache(memory, stacked=stacked)
        for stacked in (True, False)
    }
    # max_length 5, unlike the 4 heads: swapped axes would not fit.
    zeros = np.zeros((2, 2, 5, 4, HIDDEN // 4), "float32")
    own = {True: zeros, False: (zeros[:, 0].transpose(0, 2, 1, 3),) * 2}
    for at in range(3):
        results = {}
        for stacked in (True, False):
            out, *rest = attention(
                steps[:, at : at + 1],
                cache=own[stacked],
                cache_update_index=at,
                use_causal_mask=True,
                return_attention_scores=scores,
            )
            own[stacked] = rest[-1]
            # Cross-attention returns its cache unchanged, last.
            *crossed, _ = attention(
                steps[:, at : at + 1],
                key_padding_mask=padding,
                attention_mask=allowed,
                cache=cross[stacked],
                return_attention_scores=scores,
            )
            results[stacked] = [out, *rest[:-1], *crossed]
        for split, stacked in zip(results[False], results[True], strict=True):
            np.testing.assert_allclose(
                to_numpy(split), to_numpy(stacked), atol=1e-5, rtol=1e-5
            )
    for half in (0, 1):
        np.testing.assert_allclose(
            to_numpy(own[False][half]),
            to_numpy(own[True])[:, half].transpose(0, 2, 1, 3),
            atol=1e-6,
        )
    assert one_query() == (0 if scores else 6)


def _count_calls(monkeypatch, name):
    """Counts the calls of ``MultiHeadAttention.<name>``; returns a
    function that reads the count."""
    calls = []
    original = getattr(layers.MultiHeadAttention, name)

    def counted(self, *args, **kwargs):
        calls.append(name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(layers.MultiHeadAttention, name, counted)
    return lambda: len(calls)


def test_one_query_attention_keeps_float32_logits_under_mixed_precision(rng):
    """Logits near 20 that differ by tenths: rounded to bfloat16 (steps
    of 1/8 there) before the softmax, the weights would move by several
    percent. Identity projections, so the query and the cache are the
    attention's own; the reference is float64 on the same values."""
    heads, head_dim = 2, HIDDEN // 2
    attention = layers.MultiHeadAttention(heads, dtype="mixed_bfloat16")
    attention(np.zeros((1, 1, HIDDEN), "float32"))
    identity = np.eye(HIDDEN, dtype="float32")
    attention.query_dense.kernel.assign(
        identity.reshape(HIDDEN, heads, head_dim)
    )
    attention.output_dense.kernel.assign(
        identity.reshape(heads, head_dim, HIDDEN)
    )

    def bfloat16(values):
        return to_numpy(ops.cast(ops.cast(values, "bfloat16"), "float32"))

    q = bfloat16(rng.uniform(1, 2, size=(1, 1, HIDDEN)))
    # q . k / sqrt(head_dim) about 20 for every key, spread by about 1.
    k = rng.uniform(1, 2, size=(1, heads, 1, head_dim)) * 80 / 2.25 / 16
    k = bfloat16(k + 0.1 * rng.normal(size=(1, heads, 8, head_dim)))
    v = bfloat16(rng.normal(size=(1, heads, 8, head_dim)))
    out, _ = attention(
        q, cache=(ops.cast(k, "bfloat16"), ops.cast(v, "bfloat16"))
    )
    logits = np.einsum(
        "bnh,bnsh->bns", q.reshape(1, heads, head_dim).astype("float64"), k
    ) / np.sqrt(head_dim)
    assert 15 < logits.mean() < 25 and logits.std() > 0.3
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bns,bnsh->bnh", weights, v).reshape(1, 1, HIDDEN)
    np.testing.assert_allclose(
        to_numpy(out).astype("float32"), expected, atol=1.5e-2, rtol=1.5e-2
    )


@pytest.mark.parametrize(
    "shapes,message",
    [
        ([(2, 4, 3, 8)] * 3, r"got 3 tensors"),
        ([(2, 3, 4, 8)] * 2, r"num_heads=4, length, head_dim=8"),
        ([(2, 4, 3, 8, 1)] * 2, r"shapes \[\(2, 4, 3, 8, 1\)"),
    ],
    ids=["three", "length first", "rank"],
)
def test_split_cache_must_be_a_heads_first_pair(shapes, message, rng):
    attention = layers.MultiHeadAttention(num_heads=4)
    x = rng.normal(size=(2, 1, HIDDEN)).astype("float32")
    attention(x)
    cache = tuple(np.zeros(shape, "float32") for shape in shapes)
    with pytest.raises(ValueError, match=message):
        attention(x, cache=cache)
