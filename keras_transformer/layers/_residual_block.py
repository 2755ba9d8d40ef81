import keras

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.utils import (
    check_bool,
    check_positive,
    check_positive_float,
    check_rate,
    clone_initializer,
)


class ResidualBlockBase(keras.layers.Layer):
    """Arguments, sublayer factories and config shared by the encoder and
    decoder layers. Not public: use `TransformerEncoderLayer` or
    `TransformerDecoderLayer`."""

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation="relu",
        normalize_first=False,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive("num_heads", num_heads)
        self.intermediate_dim = check_positive(
            "intermediate_dim", intermediate_dim
        )
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate(
            "attention_dropout", attention_dropout
        )
        self.activation_dropout = check_rate(
            "activation_dropout", activation_dropout
        )
        self.activation = keras.activations.get(activation)
        self.normalize_first = check_bool("normalize_first", normalize_first)
        self.layer_norm_epsilon = check_positive_float(
            "layer_norm_epsilon", layer_norm_epsilon
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _sublayer_kwargs(self, salt):
        return {
            "kernel_initializer": clone_initializer(
                self.kernel_initializer, salt
            ),
            "bias_initializer": clone_initializer(self.bias_initializer, salt),
            "dtype": self.dtype_policy,
        }

    def _norm(self, name, input_shape):
        norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        norm.build(input_shape)
        return norm

    def _attention(self, name, query_shape, value_shape=None, salt=0):
        attention = MultiHeadAttention(
            self.num_heads,
            dropout=self.attention_dropout,
            name=name,
            **self._sublayer_kwargs(salt),
        )
        attention.build(query_shape, value_shape)
        return attention

    def _feed_forward(self, name, input_shape):
        feed_forward = PositionwiseFeedForward(
            self.intermediate_dim,
            activation=self.activation,
            activation_dropout=self.activation_dropout,
            name=name,
            **self._sublayer_kwargs(2),
        )
        feed_forward.build(input_shape)
        return feed_forward

    def _dropout(self, name):
        return Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _residual(self, x, sublayer, norm, dropout, training):
        """``LayerNorm(x + Dropout(sublayer(x)))``, or pre-norm
        ``x + Dropout(sublayer(LayerNorm(x)))``.

        ``sublayer`` may return a tuple whose first element is the output;
        the rest is passed through, e.g. attention weights and caches.
        """
        h = norm(x) if self.normalize_first else x
        results = sublayer(h)
        extras = ()
        if isinstance(results, tuple):
            results, extras = results[0], results[1:]
        x = x + dropout(results, training=training)
        if not self.normalize_first:
            x = norm(x)
        return (x,) + extras

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout,
                "activation": keras.activations.serialize(self.activation),
                "normalize_first": self.normalize_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
