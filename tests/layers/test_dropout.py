"""`layers.Dropout`: Keras's Dropout, registered under this package."""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops

import keras_transformer as kt
from keras_transformer import backends, layers
from tests.helpers import random_batch, tiny_model, to_numpy

BACKEND = keras.backend.backend()


def nonzero_inputs(rng, shape):
    # No input element is 0, so every 0 in the output is a dropped one.
    x = rng.normal(size=shape).astype("float32")
    return np.where(np.abs(x) < 0.1, 0.5, x).astype("float32")


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    rate=st.floats(0.05, 0.95),
    shared=st.lists(st.booleans(), min_size=3, max_size=3),
    seed=st.integers(0, 2**31 - 1),
)
def test_each_element_is_dropped_or_scaled(shape, rate, shared, seed):
    rng = np.random.default_rng(seed)
    x = nonzero_inputs(rng, shape)
    # A mask shared along some axes (size 1 there), drawn along the others.
    noise_shape = tuple(
        1 if share else None for share, _ in zip(shared, shape, strict=False)
    )
    layer = layers.Dropout(rate, noise_shape=noise_shape, seed=seed)
    y = to_numpy(layer(x, training=True))
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - rate), rtol=1e-6)
    for axis, share in zip(range(len(shape)), shared, strict=False):
        if share:
            # The same decision all along a shared axis.
            first = np.take(kept, [0], axis=axis)
            np.testing.assert_array_equal(
                kept, np.broadcast_to(first, kept.shape)
            )
    # Off training, and at rate 0, the identity.
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)
    np.testing.assert_array_equal(
        to_numpy(layers.Dropout(0.0)(x, training=True)), x
    )


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_masks_keep_one_minus_rate_and_are_independent(rate, rng):
    n = 200_000
    x = np.ones((100, n // 100), "float32")
    layer = layers.Dropout(rate, seed=7)
    first = to_numpy(layer(x, training=True)) != 0
    second = to_numpy(layer(x, training=True)) != 0
    keep = 1 - rate
    sigma = np.sqrt(keep * rate / n)
    for mask in (first, second):
        assert abs(mask.mean() - keep) < 5 * sigma
        # Every row and column keeps about as many.
        for axis in (0, 1):
            assert abs(mask.mean(axis=axis) - keep).max() < 6 * np.sqrt(
                keep * rate / mask.shape[axis]
            )
    # Two draws agree where independent draws would: keep^2 + rate^2.
    agree = keep**2 + rate**2
    sigma = np.sqrt(agree * (1 - agree) / n)
    assert abs((first == second).mean() - agree) < 5 * sigma
    # Neighbours are uncorrelated.
    flat = first.ravel().astype("float64")
    assert abs(np.corrcoef(flat[:-1], flat[1:])[0, 1]) < 5 / np.sqrt(n)


def test_masks_follow_the_seed(rng):
    x = nonzero_inputs(rng, (8, 64))

    def masks(layer, calls=2):
        return [to_numpy(layer(x, training=True)) != 0 for _ in range(calls)]

    a = masks(layers.Dropout(0.5, seed=3))
    b = masks(layers.Dropout(0.5, seed=3))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert (a[0] != a[1]).any()  # a new mask every call
    other = masks(layers.Dropout(0.5, seed=4), calls=1)[0]
    assert (other != a[0]).any()


def test_masks_are_keras_dropouts(rng):
    x = nonzero_inputs(rng, (16, 64))
    ours = to_numpy(layers.Dropout(0.5, seed=3)(x, training=True))
    theirs = to_numpy(keras.layers.Dropout(0.5, seed=3)(x, training=True))
    np.testing.assert_array_equal(ours, theirs)


def test_mixed_precision_drops_in_the_compute_dtype(rng):
    x = nonzero_inputs(rng, (8, 32))
    layer = layers.Dropout(0.5, seed=2, dtype="mixed_bfloat16")
    y = layer(x, training=True)
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    y = to_numpy(ops.cast(y, "float32"))
    x16 = to_numpy(ops.cast(ops.cast(x, "bfloat16"), "float32"))
    kept = y != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_array_equal(y[kept], x16[kept] * 2)


def _value_and_input_gradient(layer, x, weights):
    """``y = layer(x, training=True)`` and the gradient of ``sum(weights *
    y)`` with respect to ``x``, from the same call."""
    if BACKEND == "jax":
        import jax

        def f(x, state):
            y, state = layer.stateless_call([], state, x, training=True)
            return (weights * y).sum(), y

        state = [v.value for v in layer.non_trainable_variables]
        (_, y), grad = jax.value_and_grad(f, has_aux=True)(x, state)
        return np.asarray(y), np.asarray(grad)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            total = tf.reduce_sum(weights * y)
        return y.numpy(), tape.gradient(total, x).numpy()
    import torch

    x = torch.tensor(x, requires_grad=True)
    y = layer(x, training=True)
    (torch.from_numpy(weights) * y).sum().backward()
    return y.detach().cpu().numpy(), x.grad.cpu().numpy()


def test_gradient_is_the_mask_over_the_keep_probability(rng):
    x = nonzero_inputs(rng, (4, 8, 32))
    weights = rng.normal(size=x.shape).astype("float32")
    y, grad = _value_and_input_gradient(layers.Dropout(0.3, seed=5), x, weights)
    kept = y != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(grad, kept * weights / 0.7, rtol=1e-6)


def test_compiled_training_draws_new_masks_each_step(rng):
    # model.fit's compiled step (jax.jit on JAX) advances each layer's
    # seed: with the learning rate 0, only the masks change the loss.
    model = tiny_model(dropout=0.3)
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss=kt.training.LabelSmoothedCrossEntropy(0.1),
    )
    batch = random_batch(rng)
    labels = np.roll(batch["decoder_token_ids"], -1, axis=1)
    dropouts = [
        layer
        for layer in _sublayers(model)
        if isinstance(layer, keras.layers.Dropout) and layer.rate > 0
    ]
    assert dropouts and all(isinstance(d, layers.Dropout) for d in dropouts)
    # Unseeded dropout on torch draws from torch's global generator
    # (saved by training checkpoints, `backends.global_rng_state`), elsewhere
    # from the layers' seed generators.
    start = [to_numpy(d.seed_generator.state) for d in dropouts]
    global_start = backends.global_rng_state()
    losses = [float(model.train_on_batch(batch, labels)) for _ in range(2)]
    assert losses[0] != losses[1]
    for d, state in zip(dropouts, start, strict=True):
        if BACKEND != "torch":
            assert (to_numpy(d.seed_generator.state) != state).any()
        d.seed_generator.state.assign(state)
    backends.set_global_rng_state(global_start)
    # The same seeds give the same masks, hence the first loss again.
    assert float(model.train_on_batch(batch, labels)) == pytest.approx(
        losses[0], rel=1e-6
    )


def _sublayers(layer):
    return [layer, *(s for s in layer._flatten_layers(include_self=False))]


def test_noise_shape_of_another_rank_names_the_value(rng):
    layer = layers.Dropout(0.5, noise_shape=(None, 1))
    with pytest.raises(ValueError, match=r"noise_shape=\(None, 1\) must have"):
        layer(nonzero_inputs(rng, (2, 3, 4)), training=True)


def test_variables_are_keras_dropouts(rng):
    # Checkpoints written with keras.layers.Dropout load: the same
    # variables (the seed generator's state).
    ours, theirs = layers.Dropout(0.2, seed=1), keras.layers.Dropout(0.2)
    assert isinstance(ours, keras.layers.Dropout)

    def described(layer):
        return [
            (v.path.split("/")[-1], tuple(v.shape), v.dtype)
            for v in layer.variables
        ]

    assert described(ours) == described(theirs) != []
    x = nonzero_inputs(rng, (4, 16))
    for mine, other in zip(ours.variables, theirs.variables, strict=True):
        mine.assign(other)
    state = to_numpy(theirs.seed_generator.state)
    np.testing.assert_array_equal(to_numpy(ours.seed_generator.state), state)
    # A restored state gives the mask it gave before.
    first = to_numpy(ours(x, training=True))
    ours.seed_generator.state.assign(state)
    np.testing.assert_array_equal(to_numpy(ours(x, training=True)), first)
