import keras

from keras_transformer import backends


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, whose masks are drawn faster on a JAX CPU.

    The same layer (arguments, seed generator, config, saved variables)
    and the same arithmetic: in training, each element is kept with
    probability ``1 - rate`` and scaled by ``1 / (1 - rate)`` (Vaswani et
    al., 2017, 5.4, residual dropout). Keras's JAX dropout draws the mask
    with `jax.random.bernoulli`, whose threefry bits are a chain of 32-bit
    integer operations for every element. On JAX's CPU, without a
    `keras.distribution`, this layer takes threefry bits of its own from
    XLA (`lax.rng_bit_generator`), which XLA's CPU compiler vectorizes:
    `python -m benchmarks.dropout` draws the 32 masks of a training step
    faster (`docs/performance.md`). The mask stream is not
    `keras.layers.Dropout`'s for the same seed, and may change with the
    XLA version (a test pins it); it is a function of the layer's seed
    generator, whose state training checkpoints keep. Elsewhere (other
    backends, JAX on an accelerator, and sharded JAX, where XLA would
    draw the whole batch's mask on every device) the layer runs
    `keras.layers.Dropout`'s code, and so does every backend with the
    ``jax_dropout`` fast path switched off (`keras_transformer.backends`).

    Args:
        rate: the fraction of elements dropped, P_drop, in ``[0, 1]``.
        noise_shape: the shape of the mask, broadcast to the input's; None
            entries take the input's size (as in `keras.layers.Dropout`).
        seed: an int, for a reproducible mask stream.

    Call arguments:
        inputs: a tensor of any shape.
        training: drop elements only when True.

    Example:
    >>> layer = Dropout(0.5, seed=1)
    >>> y = layer(keras.ops.ones((4, 8)), training=True)
    >>> set(keras.ops.convert_to_numpy(y).ravel().tolist()) <= {0.0, 2.0}
    True
    """

    def call(self, inputs, training=False):
        if not (training and 0 < self.rate < 1):
            return super().call(inputs, training=training)
        noise_shape = self.noise_shape
        if noise_shape is not None and len(noise_shape) != len(inputs.shape):
            raise ValueError(
                f"noise_shape={noise_shape} must have one entry per axis of "
                f"the input, of shape {tuple(inputs.shape)}; use None for an "
                f"axis whose mask varies and 1 for one it is shared along."
            )
        dropout = backends.dropout_function()
        if dropout is None:
            return super().call(inputs, training=training)
        return dropout(
            inputs, self.rate, noise_shape, self.seed_generator.next()
        )
