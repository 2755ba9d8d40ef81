import keras

from keras_transformer.layers._residual_block import ResidualBlockBase


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoderLayer(ResidualBlockBase):
    """One encoder layer (Vaswani et al., 2017, 3.1 and 5.4).

    Two sublayers, multi-head self-attention and the position-wise
    feed-forward network, each wrapped as
    ``LayerNorm(x + Dropout(Sublayer(x)))`` (post-norm, the paper's).
    ``normalize_first=True`` gives the pre-norm variant
    ``x + Dropout(Sublayer(LayerNorm(x)))``, which trains more stably in
    deep stacks; the model then adds a final LayerNorm after the stack.

    Args:
        num_heads: h.
        intermediate_dim: d_ff.
        dropout: P_drop, applied to each sublayer's output before the
            residual addition.
        attention_dropout: dropout on the attention weights.
        activation_dropout: dropout inside the feed-forward network.
        activation: the feed-forward activation, ``"relu"`` in the paper.
        normalize_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of the layer normalizations.
        kernel_initializer, bias_initializer: for every dense sublayer.

    Call arguments:
        inputs: ``(batch, length, d_model)``.
        padding_mask: ``(batch, length)``, 1 for real tokens.
        return_attention_scores: also return the self-attention weights.
        training: whether dropout is active.

    Example:
    >>> layer = TransformerEncoderLayer(num_heads=4, intermediate_dim=128)
    >>> layer(keras.ops.ones((2, 7, 64))).shape
    (2, 7, 64)
    """

    def build(self, inputs_shape):
        self.self_attention = self._attention("self_attention", inputs_shape)
        self.self_attention_norm = self._norm(
            "self_attention_norm", inputs_shape
        )
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.feed_forward = self._feed_forward("feed_forward", inputs_shape)
        self.feed_forward_norm = self._norm("feed_forward_norm", inputs_shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        x, *scores = self._residual(
            inputs,
            lambda h: self.self_attention(
                h,
                key_padding_mask=padding_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            ),
            self.self_attention_norm,
            self.self_attention_dropout,
            training,
        )
        (x,) = self._residual(
            x,
            lambda h: self.feed_forward(h, training=training),
            self.feed_forward_norm,
            self.feed_forward_dropout,
            training,
        )
        if return_attention_scores:
            return x, scores[0]
        return x
