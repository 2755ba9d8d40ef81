import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, registered under this package, with a
    clear error for a ``noise_shape`` of the wrong rank.

    In training, each element is kept with probability ``1 - rate`` and
    scaled by ``1 / (1 - rate)`` (Vaswani et al., 2017, 5.4, residual
    dropout); the masks are Keras's own, a function of the layer's seed
    generator, whose state training checkpoints keep.

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
        return super().call(inputs, training=training)
