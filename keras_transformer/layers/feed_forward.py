import keras

from keras_transformer.layers.dropout import Dropout
from keras_transformer.utils import (
    check_positive,
    check_rate,
    clone_initializer,
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """Position-wise feed-forward network (Vaswani et al., 2017, 3.3).

    ``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``: two linear maps with a ReLU
    between them, d_model -> d_ff -> d_model, applied to every position
    separately.

    Args:
        intermediate_dim: d_ff, the inner dimension (2048 in the base
            model).
        activation: the inner activation; ``"relu"`` in the paper.
        activation_dropout: dropout on the inner activations (not in the
            paper, 0 by default; tensor2tensor calls it "relu dropout").
        kernel_initializer, bias_initializer: initializers of both maps.

    Call arguments:
        inputs: ``(batch, length, d_model)``.
        training: whether dropout is active.

    Example:
    >>> ffn = PositionwiseFeedForward(intermediate_dim=256)
    >>> ffn(keras.ops.ones((2, 7, 64))).shape
    (2, 7, 64)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        activation_dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive(
            "intermediate_dim", intermediate_dim
        )
        self.activation = keras.activations.get(activation)
        self.activation_dropout = check_rate(
            "activation_dropout", activation_dropout
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _initializers(self, salt):
        return {
            "kernel_initializer": clone_initializer(
                self.kernel_initializer, salt
            ),
            "bias_initializer": clone_initializer(self.bias_initializer, salt),
        }

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        self.intermediate_dense = keras.layers.Dense(
            self.intermediate_dim,
            activation=self.activation,
            dtype=self.dtype_policy,
            name="intermediate_dense",
            **self._initializers(0),
        )
        self.intermediate_dense.build(input_shape)
        self.intermediate_dropout = Dropout(
            self.activation_dropout,
            dtype=self.dtype_policy,
            name="intermediate_dropout",
        )
        self.output_dense = keras.layers.Dense(
            hidden_dim,
            dtype=self.dtype_policy,
            name="output_dense",
            **self._initializers(1),
        )
        self.output_dense.build(
            tuple(input_shape[:-1]) + (self.intermediate_dim,)
        )
        self.built = True

    def call(self, inputs, training=None):
        x = self.intermediate_dense(inputs)
        x = self.intermediate_dropout(x, training=training)
        return self.output_dense(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": keras.activations.serialize(self.activation),
                "activation_dropout": self.activation_dropout,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
