import math

import keras
from keras import ops

from keras_transformer import backends
from keras_transformer.layers.dropout import Dropout
from keras_transformer.utils import (
    check_bool,
    check_positive,
    check_rate,
    clone_initializer,
)

# Added to the logits of masked keys. Large enough that exp() underflows to
# exactly 0 in float32, small enough to stay finite after scaling.
_MASK_LOGIT = -1e9


class _HeadsProjection(keras.layers.EinsumDense):
    """The `EinsumDense` of a head projection, computed as a tensordot.

    ``btd,dnh->btnh`` and ``btnh,nhd->btd`` contract the last one or two
    axes of the input with the first of the kernel: a matrix product.
    Torch's einsum runs them more slowly than its tensordot, which is
    that matrix product, most of all for the few rows of a decoding
    step; XLA compiles both forms alike. The variables, and so what is
    saved and loaded, are `EinsumDense`'s, LoRA included (its ``kernel``
    adds the LoRA product). Quantization is `EinsumDense`'s too:
    `quantize` is allowed on this subclass, and a quantized layer runs
    `quantized_call`, which `Layer.__call__` calls instead of ``call``.
    """

    _CONTRACTED_AXES = {"btd,dnh->btnh": 1, "btnh,nhd->btd": 2}

    def call(self, inputs, training=None):
        axes = self._CONTRACTED_AXES.get(self.equation)
        if axes is None:
            return super().call(inputs, training=training)
        x = ops.tensordot(inputs, self.kernel, axes=axes)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def quantize(self, mode=None, type_check=True, config=None):
        # `EinsumDense.quantize` refuses subclasses unless told otherwise;
        # this one only changes how the float product is computed.
        return super().quantize(mode, type_check=False, config=config)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (Vaswani et al., 2017, 3.2).

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with
    ``head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k)) V W_i^V`` and
    ``d_k = d_v = d_model / h``. The model dimension d_model is read from
    the last axis of the query, so the layer takes only ``num_heads``.

    The attention itself runs through `keras.ops.dot_product_attention`, so
    each backend's fused kernel is used where it exists. When attention
    weights are requested, or attention dropout is active in training, the
    layer computes them explicitly (softmax in float32) instead.

    Masks use 1 (or True) for positions that may be attended to:
    ``key_padding_mask`` is ``(batch, key_length)``, ``attention_mask`` is
    ``(batch, query_length, key_length)`` and ``use_causal_mask`` stops each
    query from seeing later keys. They combine with a logical and.

    Incremental decoding (section 3.2.3 in the decoder, one position at a
    time) uses a key/value cache, either stacked, one tensor of shape
    ``(batch, 2, max_length, num_heads, head_dim)``, or split, a
    ``(keys, values)`` tuple of ``(batch, num_heads, max_length,
    head_dim)`` tensors:

    - self-attention: pass ``cache`` and ``cache_update_index``; the keys
      and values of ``query`` are written into the cache at that index and
      the query attends to cache positions ``<= cache_update_index + i``.
    - cross-attention: compute the cache once with
      `compute_key_value_cache(encoder_output)` (``stacked=False`` for a
      split one) and pass it as ``cache`` without an index; ``value`` is
      then ignored.

    The split layout is for compiled decoding loops (XLA): each step
    reads the keys and values where they lie, in the heads-first layout
    of the attention's matrix products, and XLA updates them in place
    (eager backends copy the updated half). The stacked one is sliced
    into keys and values and transposed, which XLA does by copying the
    cache at every step. The attention of a single query on a split
    cache is computed as two batched matrix-vector products
    (`keras.ops.einsum`).

    Args:
        num_heads: h, the number of heads.
        dropout: dropout rate on the attention weights (off in the paper's
            base model; "attention dropout" in later implementations).
        use_bias: whether the projections have biases.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.

    Call arguments:
        query: ``(batch, query_length, d_model)``.
        value: ``(batch, key_length, d_model)``; defaults to ``query``.
        key: defaults to ``value``.
        key_padding_mask, attention_mask, use_causal_mask: see above.
        cache, cache_update_index: see above.
        return_attention_scores: also return the attention weights,
            ``(batch, num_heads, query_length, key_length)``.
        training: whether dropout is active.

    Returns:
        ``output``, then the attention weights if requested, then the
        updated cache if a cache was passed.

    Example:
    >>> attention = MultiHeadAttention(num_heads=4)
    >>> x = keras.ops.ones((2, 7, 64))
    >>> attention(x, key_padding_mask=keras.ops.ones((2, 7))).shape
    (2, 7, 64)
    """

    def __init__(
        self,
        num_heads,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive("num_heads", num_heads)
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = check_bool("use_bias", use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, query_shape, value_shape=None, key_shape=None):
        hidden_dim = query_shape[-1]
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must divide "
                f"hidden_dim={hidden_dim} (d_k = d_model / h). Choose a "
                "hidden_dim that is a multiple of num_heads."
            )
        self.hidden_dim = hidden_dim
        self.head_dim = hidden_dim // self.num_heads
        value_dim = hidden_dim if value_shape is None else value_shape[-1]
        key_dim = value_dim if key_shape is None else key_shape[-1]

        def projection(name, input_dim, salt):
            layer = _HeadsProjection(
                "btd,dnh->btnh",
                output_shape=(None, self.num_heads, self.head_dim),
                bias_axes="nh" if self.use_bias else None,
                kernel_initializer=clone_initializer(
                    self.kernel_initializer, salt
                ),
                bias_initializer=clone_initializer(self.bias_initializer, salt),
                dtype=self.dtype_policy,
                name=name,
            )
            layer.build((None, None, input_dim))
            return layer

        self.query_dense = projection("query", hidden_dim, 0)
        self.key_dense = projection("key", key_dim, 1)
        self.value_dense = projection("value", value_dim, 2)
        self.output_dense = _HeadsProjection(
            "btnh,nhd->btd",
            output_shape=(None, hidden_dim),
            bias_axes="d" if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer, 3),
            bias_initializer=clone_initializer(self.bias_initializer, 3),
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build((None, None, self.num_heads, self.head_dim))
        self.attention_dropout = Dropout(
            self.dropout, dtype=self.dtype_policy, name="attention_dropout"
        )
        # cuDNN's fused attention on JAX's GPU takes only masks as long
        # as the queries (see `backends.broadcast_attention_masks`).
        self._broadcast_masks = backends.broadcast_attention_masks()
        self.built = True

    def compute_key_value_cache(self, value, key=None, *, stacked=True):
        """Projects encoder outputs once for cached cross-attention.

        Returns a ``(batch, 2, key_length, num_heads, head_dim)`` tensor,
        or with ``stacked=False`` a ``(keys, values)`` tuple of ``(batch,
        num_heads, key_length, head_dim)`` tensors.
        """
        key = value if key is None else key
        keys = self.key_dense(key)
        values = self.value_dense(value)
        if stacked:
            return ops.stack([keys, values], 1)
        return (_heads_first(keys), _heads_first(values))

    def call(
        self,
        query,
        value=None,
        key=None,
        key_padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        value = query if value is None else value
        key = value if key is None else key
        # (batch, query_length, num_heads, head_dim)
        q = self.query_dense(query)
        k, v, cache = self._keys_and_values(
            key, value, cache, cache_update_index
        )
        split = isinstance(cache, (tuple, list))
        # Split caches hold the keys heads first.
        key_length = ops.shape(k)[2] if split else ops.shape(k)[1]
        mask = attention_mask_of_call(
            ops.shape(q)[1],
            key_length,
            key_padding_mask,
            attention_mask,
            use_causal_mask,
            cache_update_index,
        )
        explicit = return_attention_scores or (self.dropout > 0 and training)
        scores = None
        if split and q.shape[1] == 1 and not explicit:
            output = self._one_query_attention(q, k, v, mask)
        else:
            if split:
                # The general path takes keys and values length first.
                k, v = _heads_first(k), _heads_first(v)
            if explicit:
                output, scores = self._explicit_attention(
                    q, k, v, mask, training
                )
            else:
                output = self._fused_attention(q, k, v, mask)
        output = self.output_dense(output)

        results = (output,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _keys_and_values(self, key, value, cache, cache_update_index):
        """The keys and values to attend to, and the cache with this
        step's written in (section 3.2.3's decoder, one step at a time).
        Keys and values are ``(batch, length, heads, head_dim)``, or
        heads first with a split cache."""
        if cache is None:
            return self.key_dense(key), self.value_dense(value), None
        if isinstance(cache, (tuple, list)):
            self._check_split_cache(cache)
            if cache_update_index is None:
                # Cross-attention: keys and values were computed once.
                return cache[0], cache[1], cache
            start = [0, 0, cache_update_index, 0]
            keys = ops.slice_update(
                cache[0], start, _heads_first(self.key_dense(key))
            )
            values = ops.slice_update(
                cache[1], start, _heads_first(self.value_dense(value))
            )
            return keys, values, (keys, values)
        if cache_update_index is not None:
            # One update of the whole stacked cache (one copy on eager
            # backends, not one per half plus a stack).
            # (batch, 2, steps, num_heads, head_dim)
            update = ops.stack(
                [self.key_dense(key), self.value_dense(value)], axis=1
            )
            start = [0, 0, cache_update_index, 0, 0]
            cache = ops.slice_update(cache, start, update)
        return cache[:, 0], cache[:, 1], cache

    def _fused_attention(self, q, k, v, mask):
        """`keras.ops.dot_product_attention`: each backend's fused kernel
        where it has one."""
        if mask is not None and self._broadcast_masks:
            mask = ops.broadcast_to(
                mask, (ops.shape(mask)[0], 1, ops.shape(q)[1], ops.shape(k)[1])
            )
        return ops.dot_product_attention(
            q, k, v, mask=mask, scale=1.0 / math.sqrt(self.head_dim)
        )

    def _check_split_cache(self, cache):
        shapes = [tuple(part.shape) for part in cache]
        expected = (self.num_heads, None, self.head_dim)
        if len(cache) != 2 or any(
            len(shape) != 4
            or any(
                want is not None and have is not None and want != have
                for want, have in zip(expected, shape[1:], strict=True)
            )
            for shape in shapes
        ):
            raise ValueError(
                f"A split cache is a (keys, values) pair of (batch, "
                f"num_heads={self.num_heads}, length, "
                f"head_dim={self.head_dim}) tensors, heads first; got "
                f"{len(cache)} tensors of shapes {shapes}. Make it with "
                "`Transformer.init_cache(..., stacked=False)` or "
                "`compute_key_value_cache(..., stacked=False)`."
            )

    def _one_query_attention(self, q, k, v, mask):
        """Attention of one query position on a split cache: ``q`` is
        ``(batch, 1, heads, head_dim)``, ``k`` and ``v`` are ``(batch,
        heads, keys, head_dim)``. Logits and softmax in float32."""
        q32 = ops.cast(q[:, 0], "float32") * (1.0 / math.sqrt(self.head_dim))
        # (batch, heads, keys)
        logits = ops.einsum("bnh,bnsh->bns", q32, ops.cast(k, "float32"))
        if mask is not None:
            # (batch or 1, 1, 1, keys) -> (batch or 1, 1, keys)
            logits = ops.where(mask[:, 0], logits, _MASK_LOGIT)
        weights = ops.cast(ops.softmax(logits, axis=-1), v.dtype)
        # (batch, 1, heads, head_dim)
        return ops.einsum("bns,bnsh->bnh", weights, v)[:, None]

    def _explicit_attention(self, q, k, v, mask, training):
        # Logits and softmax in float32, also under mixed precision.
        q32 = ops.cast(q, "float32") * (1.0 / math.sqrt(self.head_dim))
        # (batch, num_heads, query_length, key_length)
        logits = ops.einsum("btnh,bsnh->bnts", q32, ops.cast(k, "float32"))
        if mask is not None:
            logits = ops.where(mask, logits, _MASK_LOGIT)
        scores = ops.softmax(logits, axis=-1)
        weights = self.attention_dropout(scores, training=training)
        weights = ops.cast(weights, self.compute_dtype)
        # (batch, query_length, num_heads, head_dim)
        output = ops.einsum("bnts,bsnh->btnh", weights, v)
        return output, scores

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config


def _heads_first(x):
    """``(batch, length, heads, head_dim)`` <-> ``(batch, heads, length,
    head_dim)``: the transposition is its own inverse."""
    return ops.transpose(x, (0, 2, 1, 3))


def attention_mask_of_call(
    query_length,
    key_length,
    key_padding_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    cache_update_index=None,
):
    """The boolean ``(batch or 1, 1, query, key)`` mask of an attention
    call with these arguments, or None."""
    mask = None

    def merge(mask, new):
        new = ops.cast(new, "bool")
        return new if mask is None else ops.logical_and(mask, new)

    if key_padding_mask is not None:
        mask = merge(mask, key_padding_mask[:, None, None, :])
    if attention_mask is not None:
        mask = merge(mask, attention_mask[:, None, :, :])
    if use_causal_mask:
        offset = 0 if cache_update_index is None else cache_update_index
        query_positions = ops.arange(query_length) + offset
        key_positions = ops.arange(key_length)
        causal = key_positions[None, :] <= query_positions[:, None]
        mask = merge(mask, causal[None, None, :, :])
    if key_padding_mask is None and attention_mask is None:
        # None, or causal alone, where every query sees key 0.
        return mask
    # A row with no visible key (a sequence that is all padding) would
    # give NaN in some fused kernels; let it attend everywhere instead.
    # Its output belongs to a padded position and is never used.
    empty = ops.logical_not(ops.any(mask, axis=-1, keepdims=True))
    return ops.logical_or(mask, empty)
