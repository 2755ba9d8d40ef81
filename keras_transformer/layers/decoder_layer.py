import keras

from keras_transformer.layers._residual_block import ResidualBlockBase


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoderLayer(ResidualBlockBase):
    """One decoder layer (Vaswani et al., 2017, 3.1, 3.2.3 and 5.4).

    Three sublayers, each wrapped as ``LayerNorm(x + Dropout(Sublayer(x)))``
    (or pre-norm with ``normalize_first=True``): masked multi-head
    self-attention, so that position i sees only positions <= i;
    cross-attention whose keys and values come from the encoder output,
    masked by the source padding mask; and the position-wise feed-forward
    network.

    For incremental decoding, pass ``self_attention_cache`` with
    ``self_attention_cache_update_index`` (the position of the first
    decoder token in this call) and ``cross_attention_cache`` from
    `compute_cross_attention_cache`; the layer then returns
    ``(outputs, self_attention_cache)`` with this step's keys and values
    written in.

    Args:
        Those of `TransformerEncoderLayer`.

    Call arguments:
        decoder_sequence: ``(batch, target_length, d_model)``.
        encoder_sequence: ``(batch, source_length, d_model)``, the encoder
            output; not needed when ``cross_attention_cache`` is given.
        decoder_padding_mask: ``(batch, target_length)``, 1 for real tokens
            (with a cache: ``(batch, cache_length)`` or None).
        encoder_padding_mask: ``(batch, source_length)``, 1 for real tokens.
        self_attention_cache: ``(batch, 2, max_length, h, d_k)``, or
            split, a ``(keys, values)`` tuple of ``(batch, h, max_length,
            d_k)`` tensors (see `MultiHeadAttention`).
        self_attention_cache_update_index: int or scalar tensor.
        cross_attention_cache: ``(batch, 2, source_length, h, d_k)``, or
            split, a ``(keys, values)`` tuple of ``(batch, h,
            source_length, d_k)`` tensors.
        return_attention_scores: also return a dict with the weights of
            ``"self_attention"`` and ``"cross_attention"``.
        training: whether dropout is active.

    Example:
    >>> layer = TransformerDecoderLayer(num_heads=4, intermediate_dim=128)
    >>> target, source = keras.ops.ones((2, 5, 64)), keras.ops.ones((2, 7, 64))
    >>> layer(target, source).shape
    (2, 5, 64)
    """

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        shape = decoder_sequence_shape
        self.self_attention = self._attention("self_attention", shape)
        self.self_attention_norm = self._norm("self_attention_norm", shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.cross_attention = self._attention(
            "cross_attention", shape, encoder_sequence_shape, salt=1
        )
        self.cross_attention_norm = self._norm("cross_attention_norm", shape)
        self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self.feed_forward = self._feed_forward("feed_forward", shape)
        self.feed_forward_norm = self._norm("feed_forward_norm", shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def compute_cross_attention_cache(self, encoder_sequence, *, stacked=True):
        """Cross-attention keys and values, computed once per source:
        stacked, or split with ``stacked=False`` (see
        `MultiHeadAttention.compute_key_value_cache`)."""
        return self.cross_attention.compute_key_value_cache(
            encoder_sequence, stacked=stacked
        )

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        if encoder_sequence is None and cross_attention_cache is None:
            raise ValueError(
                "TransformerDecoderLayer needs encoder_sequence or "
                "cross_attention_cache; both are None."
            )
        if (self_attention_cache is None) != (
            self_attention_cache_update_index is None
        ):
            raise ValueError(
                "Pass self_attention_cache and "
                "self_attention_cache_update_index together."
            )
        scores = {}

        def self_attention(h):
            results = self.self_attention(
                h,
                key_padding_mask=decoder_padding_mask,
                use_causal_mask=True,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return self._collect(
                results,
                scores if return_attention_scores else None,
                "self_attention",
            )

        def cross_attention(h):
            results = self.cross_attention(
                h,
                encoder_sequence,
                key_padding_mask=encoder_padding_mask,
                cache=cross_attention_cache,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return self._collect(
                results,
                scores if return_attention_scores else None,
                "cross_attention",
            )

        x, *new_cache = self._residual(
            decoder_sequence,
            self_attention,
            self.self_attention_norm,
            self.self_attention_dropout,
            training,
        )
        x, *_ = self._residual(
            x,
            cross_attention,
            self.cross_attention_norm,
            self.cross_attention_dropout,
            training,
        )
        (x,) = self._residual(
            x,
            lambda h: self.feed_forward(h, training=training),
            self.feed_forward_norm,
            self.feed_forward_dropout,
            training,
        )

        results = (x,)
        if return_attention_scores:
            results += (scores,)
        if self_attention_cache is not None:
            results += (new_cache[0],)
        return results[0] if len(results) == 1 else results

    @staticmethod
    def _collect(results, scores, name):
        """Moves the attention weights, if any, out of an attention
        layer's results into ``scores[name]``; returns the rest."""
        if not isinstance(results, tuple):
            return results
        output, *rest = results
        if scores is not None and rest:
            scores[name] = rest.pop(0)
        return (output, *rest)
