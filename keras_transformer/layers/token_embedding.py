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
        if self.quantization_mode == "int8":
            # Built from a quantized dtype policy (a saved config).
            self._int8_variables()
        else:
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
        return self._scaled(ops.cast(outputs, self.compute_dtype))

    def _scaled(self, outputs):
        if not self.scale:
            return outputs
        return outputs * ops.cast(
            math.sqrt(self.hidden_dim), self.compute_dtype
        )

    # --- int8 (Keras's quantization protocol, as ``keras.layers.Embedding``)

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantizes the matrix in place, as Keras's ``Embedding`` does
        for ``"int8"``: int8 values with a float32 scale per token (abs-max
        over its row), so that an embedded row is its int8 values divided
        by its scale. The reverse projection (section 3.4's pre-softmax
        linear transformation) is then an int8 matrix product with a scale
        per output unit: its inputs are quantized per row as they arrive,
        as Keras's int8 ``Dense`` quantizes its inputs. For inference: the
        int8 matrix is not trainable."""
        if mode != "int8":
            raise NotImplementedError(
                f"TokenEmbedding quantizes to 'int8' only, not {mode!r}."
            )
        self._check_quantize_args(mode, self.compute_dtype)
        values, scale = keras.quantizers.abs_max_quantize(
            self.embeddings, axis=-1, to_numpy=True
        )
        del self.embeddings
        self._tracker.unlock()
        self._int8_variables()
        self._tracker.lock()
        self.embeddings.assign(values)
        self.embeddings_scale.assign(ops.squeeze(scale, axis=-1))
        self.dtype_policy = keras.dtype_policies.get(
            f"int8_from_{self.dtype_policy.name}"
        )

    def _int8_variables(self):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.hidden_dim),
            initializer="zeros",
            dtype="int8",
            trainable=False,
        )
        self.embeddings_scale = self.add_weight(
            name="embeddings_scale",
            shape=(self.vocabulary_size,),
            initializer="ones",
            trainable=False,
        )
        self._is_quantized = True

    def _int8_call(self, inputs, reverse=False):
        if reverse:
            rows, rows_scale = keras.quantizers.abs_max_quantize(
                inputs, axis=-1
            )
            logits = ops.matmul(rows, ops.transpose(self.embeddings))
            return ops.divide(
                ops.cast(logits, self.compute_dtype),
                ops.multiply(rows_scale, self.embeddings_scale),
            )
        ids = ops.cast(inputs, "int32")
        scale = ops.take(self.embeddings_scale, ids, axis=0)
        outputs = ops.divide(
            ops.cast(
                ops.take(self.embeddings, ids, axis=0), self.compute_dtype
            ),
            ops.expand_dims(scale, axis=-1),
        )
        return self._scaled(outputs)

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
