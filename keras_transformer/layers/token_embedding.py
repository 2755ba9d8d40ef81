import math

import keras
from keras import ops

from keras_transformer.utils import check_bool, check_positive


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), reusable as the output layer.

    Section 3.4: "In the embedding layers, we multiply those weights by
    sqrt(d_model)", and the same matrix serves as the pre-softmax linear
    transformation. ``call(ids)`` embeds; ``call(hidden, reverse=True)``
    projects hidden states onto the vocabulary with the transposed matrix
    (tied weights), so one layer holds the one shared matrix.

    The default initializer, a normal with standard deviation
    ``hidden_dim ** -0.5``, gives the scaled embeddings unit variance, the
    same scale as the sinusoidal position encodings added to them.

    Args:
        vocabulary_size: number of tokens in the vocabulary.
        hidden_dim: d_model.
        scale: multiply embeddings by sqrt(hidden_dim) (the paper does).
        embeddings_initializer: initializer of the ``(vocabulary_size,
            hidden_dim)`` matrix.

    Call arguments:
        inputs: integer ids ``(batch, length)``, or with ``reverse=True``
            hidden states ``(batch, length, hidden_dim)``.
        reverse: project onto the vocabulary instead of embedding.

    Example:
    >>> embedding = TokenEmbedding(vocabulary_size=100, hidden_dim=16)
    >>> x = embedding(keras.ops.ones((2, 5), "int32"))
    >>> embedding(x, reverse=True).shape
    (2, 5, 100)
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        scale=True,
        embeddings_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive(
            "vocabulary_size", vocabulary_size
        )
        self.hidden_dim = check_positive("hidden_dim", hidden_dim)
        self.scale = check_bool("scale", scale)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(
                stddev=self.hidden_dim**-0.5
            )
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.hidden_dim),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            return self._project(inputs)
        outputs = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)
        outputs = ops.cast(outputs, self.compute_dtype)
        if self.scale:
            outputs = outputs * ops.cast(
                math.sqrt(self.hidden_dim), self.compute_dtype
            )
        return outputs

    def _project(self, inputs):
        kernel = ops.transpose(ops.cast(self.embeddings, self.compute_dtype))
        leading = tuple(inputs.shape[:-1])
        if len(leading) < 2 or not all(isinstance(n, int) for n in leading):
            return ops.matmul(inputs, kernel)
        # One (rows, hidden_dim) matrix product: for the gradient of the
        # matrix, XLA then contracts the logits' gradient over its rows
        # where it stands, instead of first copying it transposed (the
        # size of the logits; 12% of a tiny training step on JAX).
        rows = ops.reshape(inputs, (math.prod(leading), self.hidden_dim))
        logits = ops.matmul(rows, kernel)
        return ops.reshape(logits, leading + (self.vocabulary_size,))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "scale": self.scale,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
