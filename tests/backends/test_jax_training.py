"""The ``jax_train_options`` fast path: on JAX's CPU the training step is
compiled by the seam, with XLA's region analysis, and trains as Keras's
own step does; switched off, or on another backend, Keras builds it."""

import contextlib

import keras
import numpy as np

from keras_transformer import backends
from tests.helpers import random_batch, tiny_model


def _train(batch, labels, monkeypatch, disabled):
    """Three steps of a fresh tiny model; returns its losses, weights and
    how many times Keras's own `make_train_function` ran."""
    calls = []
    keras_make = keras.Model.make_train_function

    def counted(self, force=False):
        calls.append(1)
        return keras_make(self, force=force)

    monkeypatch.setattr(keras.Model, "make_train_function", counted)
    off = backends.disabled("jax_train_options")
    with off if disabled else contextlib.nullcontext():
        keras.utils.set_random_seed(0)
        model = tiny_model(dropout=0.1)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        losses = [float(model.train_on_batch(batch, labels)) for _ in range(3)]
    return losses, model.get_weights(), len(calls)


def test_train_step_matches_keras_s(monkeypatch, rng):
    batch = random_batch(rng)
    labels = rng.integers(4, 53, size=batch["decoder_token_ids"].shape)
    fast, fast_weights, fast_calls = _train(batch, labels, monkeypatch, False)
    plain, plain_weights, plain_calls = _train(batch, labels, monkeypatch, True)
    served = backends.enabled("jax_train_options") and (
        keras.distribution.list_devices()[0].startswith("cpu")
    )
    assert fast_calls == (0 if served else 1)
    assert plain_calls == 1
    # Training moved the weights, and both steps moved them alike.
    assert fast[0] != fast[-1]
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-6)
    for a, b in zip(fast_weights, plain_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
