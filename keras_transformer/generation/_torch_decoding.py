"""Decoding on torch: the layer calls and ops of `direct_calls`.

Torch runs the search loop eagerly, and a one-token step of the base
decoder makes about a hundred layer calls: the bookkeeping around each
call and each `keras.ops` call (dtype resolution, casts, argument
flattening) costs more than the step's arithmetic. Inside `direct_calls`,
`direct_sublayer_calls` (see `layers._utils`) skips `Layer.__call__`, and
the tables below replace, where they compute what Keras computes, the
calls that a step makes most:

- head projections and dense layers: one `torch.addmm` each, the bias
  added inside the matrix product;
- layer normalizations: `F.layer_norm`;
- a `TransformerDecoderLayer` step with a stacked cache, at inference:
  `decoder_step`, those same kernels in one function, without the ten or
  so sublayer calls around them;
- attention: `F.scaled_dot_product_attention`; each step writes its keys
  and values into the self-attention cache in place, instead of copying
  the whole cache as `ops.slice_update` does.

Everything else (float16 and bfloat16 inputs, which Keras computes
partly in float32; quantized or LoRA layers; other activations and
normalizations) falls back to the layer's own ``call``. Imported only on
the torch backend (by `compile.torch_direct_calls`).
"""

import functools
import math

import keras
import torch
import torch.nn.functional as F

from keras_transformer.layers._utils import (
    _calls_directly,
    direct_sublayer_calls,
    memoized,
)
from keras_transformer.layers.decoder_layer import TransformerDecoderLayer
from keras_transformer.layers.multi_head_attention import (
    _HeadsProjection,
    attention_mask_of_call,
)

_LINEAR = keras.activations.linear
# Activations computed here, and the torch function of each.
_ACTIVATIONS = {_LINEAR: None, keras.activations.relu: torch.relu}
# The keyword arguments `decoder_step` knows; with any other, the layer's
# own `call` runs (and raises for a misspelt one).
_DECODER_ARGUMENTS = frozenset(
    {
        "encoder_sequence",
        "decoder_padding_mask",
        "encoder_padding_mask",
        "self_attention_cache",
        "self_attention_cache_update_index",
        "cross_attention_cache",
        "return_attention_scores",
        "training",
    }
)

# The `TransformerDecoderLayer` options `decoder_step` computes (or that
# change nothing at inference); a layer whose config has any other (an
# option added later) runs its own `call` until `decoder_step` learns it.
_DECODER_CONFIG = frozenset(
    {
        "activation",
        "activation_dropout",
        "attention_dropout",
        "bias_initializer",
        "dropout",
        "dtype",
        "intermediate_dim",
        "kernel_initializer",
        "layer_norm_epsilon",
        "name",
        "normalize_first",
        "num_heads",
        "trainable",
    }
)


def direct_calls():
    """The `direct_sublayer_calls` context with torch's layer calls and
    ops below."""
    return direct_sublayer_calls(*_tables())


@functools.cache
def _tables():
    layer_calls = {
        _HeadsProjection: _heads_projection,
        keras.layers.Dense: _dense,
        keras.layers.LayerNormalization: _layer_norm,
        TransformerDecoderLayer: _decoder_layer,
    }
    backend_ops = {
        "dot_product_attention": _dot_product_attention,
        "write_cache_in_place": _write_cache_in_place,
    }
    return layer_calls, backend_ops


# --- helpers


def _value(variable):
    # `kernel` is a variable, or a tensor when LoRA is enabled.
    return getattr(variable, "value", variable)


def _optional_value(variable):
    return None if variable is None else _value(variable)


def _matmul(rows, kernel, bias):
    """``rows @ kernel + bias``, the bias added inside the product."""
    if bias is None:
        return torch.mm(rows, kernel)
    return torch.addmm(bias, rows, kernel)


def _projection_matrix(layer, axes, kernel):
    """A head projection's ``kernel`` as a matrix, and its bias as one
    row (or None): views of the variables."""
    kept = kernel.shape[axes:]
    matrix = kernel.reshape(math.prod(kernel.shape[:axes]), -1)
    if layer.bias is None:
        return matrix, None
    return matrix, torch.broadcast_to(_value(layer.bias), kept).reshape(-1)


# --- layer calls: each returns what ``layer.call`` would


def _heads_projection(layer, inputs, training=None):
    axes = layer._CONTRACTED_AXES.get(layer.equation)
    kernel = _value(layer.kernel)
    if (
        axes is None
        or layer.activation is not _LINEAR
        or inputs.dtype != torch.float32
        or inputs.shape[inputs.ndim - axes :] != kernel.shape[:axes]
    ):
        return layer.call(inputs, training=training)
    rows = inputs.reshape(-1, math.prod(kernel.shape[:axes]))
    x = _matmul(rows, *_projection_matrix(layer, axes, kernel))
    return x.reshape(*inputs.shape[:-axes], *kernel.shape[axes:])


def _dense(layer, inputs, training=None):
    if layer.activation not in _ACTIVATIONS or inputs.dtype != torch.float32:
        return layer.call(inputs, training=training)
    kernel = _value(layer.kernel)
    rows = inputs.reshape(-1, inputs.shape[-1])
    x = _matmul(rows, kernel, _optional_value(layer.bias))
    x = x.reshape(*inputs.shape[:-1], kernel.shape[-1])
    activation = _ACTIVATIONS[layer.activation]
    return x if activation is None else activation(x)


def _layer_norm(layer, inputs):
    # Keras computes half-precision layer norms in float32.
    axis = layer.axis if isinstance(layer.axis, list) else [layer.axis]
    last_axis_only = [a % inputs.ndim for a in axis] == [inputs.ndim - 1]
    if layer.rms_scaling or not last_axis_only or inputs.dtype != torch.float32:
        return layer.call(inputs)
    return F.layer_norm(
        inputs,
        inputs.shape[-1:],
        _optional_value(layer.gamma),
        _optional_value(layer.beta),
        layer.epsilon,
    )


def _decoder_layer(layer, decoder_sequence, *args, **kwargs):
    # Decoding passes the sequence, then keyword arguments.
    cache = kwargs.get("self_attention_cache")
    cross_cache = kwargs.get("cross_attention_cache")
    index = kwargs.get("self_attention_cache_update_index")
    weights = None
    if (
        not args
        and kwargs.keys() <= _DECODER_ARGUMENTS
        and index is not None
        and isinstance(cache, torch.Tensor)
        and isinstance(cross_cache, torch.Tensor)
        and not kwargs.get("return_attention_scores")
        and not kwargs.get("training")
        and decoder_sequence.dtype == torch.float32
    ):
        weights = memoized(
            "decoder_step_weights",
            (layer,),
            lambda: decoder_step_weights(layer),
        )
    if weights is None:
        return layer.call(decoder_sequence, *args, **kwargs)
    return decoder_step(
        weights,
        decoder_sequence,
        kwargs.get("decoder_padding_mask"),
        kwargs.get("encoder_padding_mask"),
        cache,
        int(index),
        cross_cache,
    )


# --- the decoder layer step


def decoder_step_weights(layer):
    """What `decoder_step` needs of a `TransformerDecoderLayer`: its
    matrices and bias rows, layer norm parameters, feed-forward
    activation, head counts and norm order. The tensors are views of the
    variables, so weights assigned later are seen (Keras assigns torch
    variables in place).

    None where a sublayer is not what `decoder_step` computes: not
    float32, quantized, with LoRA, another activation or another
    normalization; and for a layer with options it does not know. Read
    once per `direct_calls` context (one search), so a layer quantized or
    given LoRA inside a context keeps the weights read first.
    """
    self_attention = layer.self_attention
    cross_attention = layer.cross_attention
    feed_forward = layer.feed_forward
    intermediate = feed_forward.intermediate_dense
    projections = [
        self_attention.query_dense,
        self_attention.key_dense,
        self_attention.value_dense,
        self_attention.output_dense,
        cross_attention.query_dense,
        cross_attention.output_dense,
    ]
    norms = [
        layer.self_attention_norm,
        layer.cross_attention_norm,
        layer.feed_forward_norm,
    ]
    sublayers = [self_attention, cross_attention, feed_forward, intermediate]
    sublayers += [feed_forward.output_dense, *projections, *norms]
    if not (
        layer.get_config().keys() <= _DECODER_CONFIG
        and all(
            _calls_directly(sublayer)
            and sublayer.compute_dtype == "float32"
            and not getattr(sublayer, "lora_enabled", False)
            for sublayer in sublayers
        )
        and all(
            p.activation is _LINEAR and p.equation in p._CONTRACTED_AXES
            for p in projections
        )
        and feed_forward.output_dense.activation is _LINEAR
        and intermediate.activation in _ACTIVATIONS
        and all(
            not norm.rms_scaling and norm.axis in (-1, [-1]) for norm in norms
        )
    ):
        return None
    matrices = [
        _projection_matrix(p, p._CONTRACTED_AXES[p.equation], _value(p.kernel))
        for p in projections
    ]

    def dense(layer):
        return _value(layer.kernel), _optional_value(layer.bias)

    return {
        "self_attention": matrices[:4],
        "self_attention_heads": (
            self_attention.num_heads,
            self_attention.head_dim,
        ),
        "cross_attention": matrices[4:],
        "cross_attention_heads": (
            cross_attention.num_heads,
            cross_attention.head_dim,
        ),
        "norms": [
            (
                _optional_value(norm.gamma),
                _optional_value(norm.beta),
                norm.epsilon,
            )
            for norm in norms
        ],
        "normalize_first": layer.normalize_first,
        "intermediate": dense(intermediate),
        "activation": _ACTIVATIONS[intermediate.activation],
        "output": dense(feed_forward.output_dense),
    }


def decoder_step(
    weights,
    x,
    decoder_padding_mask,
    encoder_padding_mask,
    cache,
    index,
    cross_cache,
):
    """`TransformerDecoderLayer.call` with a stacked self-attention cache,
    at inference, as the arithmetic it comes to: the torch kernels of the
    sublayer calls above, on ``(batch * steps, width)`` rows.

    ``x``: ``(batch, steps, width)``; ``cache``: this layer's ``(batch, 2,
    max_length, heads, head_dim)`` view of the stacked cache, written at
    ``index`` in place and returned; ``cross_cache``: ``(batch, 2,
    source_length, heads, head_dim)``.
    """
    batch, steps, width = x.shape
    self_norm, cross_norm, feed_forward_norm = weights["norms"]

    def residual(rows, norm, sublayer):
        # Vaswani et al., 2017, 5.4: LayerNorm(x + Sublayer(x)).
        if weights["normalize_first"]:
            return rows + sublayer(_normalize(rows, norm))
        return _normalize(rows + sublayer(rows), norm)

    def self_attention(rows):
        query, key, value, output = weights["self_attention"]
        heads = weights["self_attention_heads"]
        # (batch, steps, heads, head_dim)
        _write_cache_in_place(
            cache,
            index,
            _matmul(rows, *key).view(batch, steps, *heads),
            _matmul(rows, *value).view(batch, steps, *heads),
        )
        mask = attention_mask_of_call(
            steps,
            cache.shape[2],
            decoder_padding_mask,
            use_causal_mask=True,
            cache_update_index=index,
        )
        queries = _matmul(rows, *query).view(batch, steps, *heads)
        attended = _dot_product_attention(
            queries, cache[:, 0], cache[:, 1], mask, _scale(heads)
        )
        return _matmul(attended.reshape(batch * steps, -1), *output)

    def cross_attention(rows):
        query, output = weights["cross_attention"]
        heads = weights["cross_attention_heads"]
        mask = attention_mask_of_call(
            steps, cross_cache.shape[2], encoder_padding_mask
        )
        queries = _matmul(rows, *query).view(batch, steps, *heads)
        attended = _dot_product_attention(
            queries, cross_cache[:, 0], cross_cache[:, 1], mask, _scale(heads)
        )
        return _matmul(attended.reshape(batch * steps, -1), *output)

    def feed_forward(rows):
        hidden = _matmul(rows, *weights["intermediate"])
        if weights["activation"] is not None:
            hidden = weights["activation"](hidden)
        return _matmul(hidden, *weights["output"])

    rows = x.reshape(batch * steps, width)
    rows = residual(rows, self_norm, self_attention)
    rows = residual(rows, cross_norm, cross_attention)
    rows = residual(rows, feed_forward_norm, feed_forward)
    return rows.view(batch, steps, width), cache


def _scale(heads):
    # As `MultiHeadAttention` computes it: 1 / sqrt(d_k).
    return 1.0 / math.sqrt(heads[1])


def _normalize(rows, norm):
    gamma, beta, epsilon = norm
    return F.layer_norm(rows, rows.shape[-1:], gamma, beta, epsilon)


# --- ops


def _dot_product_attention(query, key, value, mask=None, scale=None):
    # (batch, length, heads, head_dim) in and out, as in Keras; a boolean
    # mask (True attends), which `MultiHeadAttention` never leaves without
    # a visible key in a row.
    output = F.scaled_dot_product_attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
    )
    return output.transpose(1, 2)


def _write_cache_in_place(cache, index, key, value):
    # cache: (batch, 2, max_length, heads, head_dim), a view of the
    # model's cache; key, value: (batch, steps, heads, head_dim).
    index = int(index)
    steps = key.shape[1]
    cache[:, 0, index : index + steps] = key
    cache[:, 1, index : index + steps] = value
