"""Compiles a decoding function for the current Keras backend.

The one module of `generation` that imports a backend: each backend
compiles a loop differently, and that difference is kept here.

- JAX: `jax.jit`, with the model's variables passed in as arguments
  through a `keras.StatelessScope` (otherwise their values would be baked
  into the program as constants, and later weight updates ignored).
- TensorFlow: `tf.function`, with XLA (``jit_compile=True``) by default.
- PyTorch: eager, under `torch.no_grad()`, so that no autograd graph is
  recorded, and with `direct_sublayer_calls`, so that the model's layers
  skip `Layer.__call__`'s bookkeeping, which on a one-token step costs
  more than the arithmetic. Within it, the head projections, dense
  layers, layer normalizations and attention call torch directly
  (`_torch_layer_calls`, `_torch_ops`): the same kernels Keras calls,
  without the dtype resolution and casts around each `keras.ops` call.
  A decoder layer given a stacked cache runs as one function of those
  kernels (`decoder_step`), with its weights read once per search.
  Each step writes its keys and values into the self-attention cache in
  place, instead of copying the whole cache as `ops.slice_update` does.
"""

import functools
import math

import keras

from keras_transformer.layers._utils import _calls_directly, memoized
from keras_transformer.layers.multi_head_attention import (
    attention_mask_of_call,
)


def compile_function(fn, model, jit_compile=True):
    """Returns ``fn`` compiled for the backend.

    Args:
        fn: a function of tensors (or nested structures of tensors) that
            calls ``model``; it is traced once per input shape.
        model: the `keras.Model` whose variables ``fn`` reads, or None.
        jit_compile: on TensorFlow, compile with XLA; on JAX and torch it
            is ignored (JAX always compiles; torch runs eagerly).
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        variables = [] if model is None else list(model.variables)

        def stateless(values, *args):
            mapping = zip(variables, values, strict=True)
            with keras.StatelessScope(state_mapping=mapping):
                return fn(*args)

        jitted = jax.jit(stateless)

        def run(*args):
            return jitted([v.value for v in variables], *args)

        return run
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=jit_compile)
    if backend == "torch":
        import torch

        def run(*args):
            with torch.no_grad(), torch_direct_calls():
                return fn(*args)

        return run
    raise NotImplementedError(
        f"Decoding supports the tensorflow, jax and torch backends; the "
        f"Keras backend is {backend!r}. Set KERAS_BACKEND to one of them."
    )


def torch_direct_calls():
    """The `direct_sublayer_calls` context of decoding on torch, with the
    layer calls and ops of torch below. Torch backend only."""
    from keras_transformer.layers._utils import direct_sublayer_calls

    return direct_sublayer_calls(*_torch_tables())


@functools.cache
def _torch_tables():
    return _torch_layer_calls(), _torch_ops()


def _torch_layer_calls():
    """``layer.call`` in plain torch for the layers a decoding step calls
    most, where they compute what Keras computes: float32 inputs
    (`call_layer` only uses them for built, unquantized layers computing
    in their variables' dtype). Keras computes half-precision layer norms
    and CPU matmuls in float32; those, and any other configuration, fall
    back to ``layer.call``.

    A `TransformerDecoderLayer` step with a stacked cache, at inference,
    runs as `decoder_step`: the kernels its sublayers' calls below would
    run, in one function, with none of the about ten sublayer calls and
    their dispatch per layer, which on a one-token step cost about a
    quarter of the step. Its weights are looked up once per
    `direct_sublayer_calls` context, which is one search."""
    import torch
    import torch.nn.functional as F

    from keras_transformer.layers.decoder_layer import TransformerDecoderLayer
    from keras_transformer.layers.multi_head_attention import _HeadsProjection

    linear = keras.activations.linear
    activations = {linear: None, keras.activations.relu: torch.relu}

    def value(variable):
        # `kernel` is a variable, or a tensor when LoRA is enabled.
        return getattr(variable, "value", variable)

    def matmul(rows, kernel, bias):
        """``rows @ kernel + bias``, the bias added inside the product."""
        if bias is None:
            return torch.mm(rows, kernel)
        return torch.addmm(bias, rows, kernel)

    def heads_projection(layer, inputs, training=None):
        axes = layer._CONTRACTED_AXES.get(layer.equation)
        kernel = value(layer.kernel)
        if (
            axes is None
            or layer.activation is not linear
            or inputs.dtype != torch.float32
            or inputs.shape[inputs.ndim - axes :] != kernel.shape[:axes]
        ):
            return layer.call(inputs, training=training)
        # The contraction as one matrix product, the bias added inside it.
        kept = kernel.shape[axes:]
        rows = inputs.reshape(-1, math.prod(kernel.shape[:axes]))
        kernel, bias = projection_matrix(layer, axes)
        x = matmul(rows, kernel, bias)
        return x.reshape(*inputs.shape[:-axes], *kept)

    def projection_matrix(layer, axes):
        """A head projection's kernel as a matrix, with its bias as one
        row (or None)."""
        kernel = value(layer.kernel)
        kernel = kernel.reshape(math.prod(kernel.shape[:axes]), -1)
        if layer.bias is None:
            return kernel, None
        kept = layer.kernel.shape[axes:]
        return kernel, torch.broadcast_to(value(layer.bias), kept).reshape(-1)

    def dense(layer, inputs, training=None):
        if layer.activation not in activations or inputs.dtype != torch.float32:
            return layer.call(inputs, training=training)
        kernel = value(layer.kernel)
        rows = inputs.reshape(-1, inputs.shape[-1])
        bias = None if layer.bias is None else value(layer.bias)
        x = matmul(rows, kernel, bias)
        x = x.reshape(*inputs.shape[:-1], kernel.shape[-1])
        activation = activations[layer.activation]
        return x if activation is None else activation(x)

    def layer_norm(layer, inputs):
        axis = layer.axis if isinstance(layer.axis, list) else [layer.axis]
        last_axis_only = [a % inputs.ndim for a in axis] == [inputs.ndim - 1]
        if (
            layer.rms_scaling
            or not last_axis_only
            or inputs.dtype != torch.float32
        ):
            return layer.call(inputs)
        gamma = None if layer.gamma is None else value(layer.gamma)
        beta = None if layer.beta is None else value(layer.beta)
        return F.layer_norm(
            inputs, inputs.shape[-1:], gamma, beta, layer.epsilon
        )

    def decoder_layer(layer, decoder_sequence, *args, **kwargs):
        # As decoding calls it: the sequence, then keyword arguments.
        cache = kwargs.get("self_attention_cache")
        cross_cache = kwargs.get("cross_attention_cache")
        index = kwargs.get("self_attention_cache_update_index")
        weights = None
        if (
            not args
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
            layer,
            weights,
            decoder_sequence,
            kwargs.get("decoder_padding_mask"),
            kwargs.get("encoder_padding_mask"),
            cache,
            int(index),
            cross_cache,
        )

    def decoder_step_weights(layer):
        """A decoder layer's weights for `decoder_step`: matrices, bias
        rows, layer norm parameters and the feed-forward activation. None
        where a sublayer is not what `decoder_step` computes: not float32
        (Keras computes those differently, see above), quantized, with
        LoRA, or with another activation or normalization."""
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
        sublayers = [self_attention, cross_attention, feed_forward]
        sublayers += [*projections, intermediate, feed_forward.output_dense]
        if not (
            all(
                _calls_directly(sublayer)
                and sublayer.compute_dtype == "float32"
                and not getattr(sublayer, "lora_enabled", False)
                for sublayer in sublayers + norms
            )
            and all(p.activation is linear for p in projections)
            and feed_forward.output_dense.activation is linear
            and intermediate.activation in activations
            and all(
                not norm.rms_scaling and norm.axis in (-1, [-1])
                for norm in norms
            )
        ):
            return None

        def optional(variable):
            return None if variable is None else value(variable)

        def dense_matrix(dense):
            return value(dense.kernel), optional(dense.bias)

        matrices = [
            projection_matrix(p, p._CONTRACTED_AXES[p.equation])
            for p in projections
        ]
        return {
            "self_attention": matrices[:4],
            "cross_attention": matrices[4:],
            "norms": [
                (optional(norm.gamma), optional(norm.beta), norm.epsilon)
                for norm in norms
            ],
            "intermediate": dense_matrix(intermediate),
            "activation": activations[intermediate.activation],
            "output": dense_matrix(feed_forward.output_dense),
        }

    def decoder_step(
        layer,
        weights,
        x,
        decoder_padding_mask,
        encoder_padding_mask,
        cache,
        index,
        cross_cache,
    ):
        """`TransformerDecoderLayer.call` with a stacked self-attention
        cache, at inference, as the arithmetic it comes to: the same torch
        kernels that the sublayers' calls above run, on ``(batch *
        steps, width)`` rows, without the sublayer calls around them."""
        batch, steps, width = x.shape
        heads = layer.self_attention.num_heads
        head_dim = width // heads
        scale = 1.0 / math.sqrt(head_dim)
        pre_norm = layer.normalize_first
        self_norm, cross_norm, feed_forward_norm = weights["norms"]

        def normalize(rows, norm):
            gamma, beta, epsilon = norm
            return F.layer_norm(rows, (width,), gamma, beta, epsilon)

        def residual(rows, norm, sublayer):
            if pre_norm:
                return rows + sublayer(normalize(rows, norm))
            return normalize(rows + sublayer(rows), norm)

        def attend(query, keys, values, mask):
            # query: (batch * steps, width); keys, values: (batch,
            # key_length, heads, head_dim) views of a cache.
            query = query.view(batch, steps, heads, head_dim).transpose(1, 2)
            output = F.scaled_dot_product_attention(
                query,
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=mask,
                scale=scale,
            )
            return output.transpose(1, 2).reshape(batch * steps, width)

        def self_attention(rows):
            query, key, value_, output = weights["self_attention"]
            write_cache_in_place(
                cache,
                index,
                matmul(rows, *key).view(batch, steps, heads, head_dim),
                matmul(rows, *value_).view(batch, steps, heads, head_dim),
            )
            mask = attention_mask_of_call(
                steps,
                cache.shape[2],
                decoder_padding_mask,
                use_causal_mask=True,
                cache_update_index=index,
            )
            attended = attend(
                matmul(rows, *query), cache[:, 0], cache[:, 1], mask
            )
            return matmul(attended, *output)

        def cross_attention(rows):
            query, output = weights["cross_attention"]
            mask = attention_mask_of_call(
                steps, cross_cache.shape[2], encoder_padding_mask
            )
            attended = attend(
                matmul(rows, *query), cross_cache[:, 0], cross_cache[:, 1], mask
            )
            return matmul(attended, *output)

        def feed_forward(rows):
            hidden = matmul(rows, *weights["intermediate"])
            if weights["activation"] is not None:
                hidden = weights["activation"](hidden)
            return matmul(hidden, *weights["output"])

        rows = x.reshape(batch * steps, width)
        rows = residual(rows, self_norm, self_attention)
        rows = residual(rows, cross_norm, cross_attention)
        rows = residual(rows, feed_forward_norm, feed_forward)
        return rows.view(batch, steps, width), cache

    return {
        _HeadsProjection: heads_projection,
        keras.layers.Dense: dense,
        keras.layers.LayerNormalization: layer_norm,
        TransformerDecoderLayer: decoder_layer,
    }


def _torch_ops():
    """`keras.ops` in plain torch, for the arguments this package passes."""
    import torch.nn.functional as F

    def dot_product_attention(query, key, value, mask=None, scale=None):
        # (batch, length, heads, head_dim) in and out, as in Keras; a
        # boolean mask (True attends), which `MultiHeadAttention` never
        # leaves without a visible key in a row.
        output = F.scaled_dot_product_attention(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
        )
        return output.transpose(1, 2)

    return {
        "dot_product_attention": dot_product_attention,
        "write_cache_in_place": write_cache_in_place,
    }


def write_cache_in_place(cache, index, key, value):
    """Writes a self-attention step into a stacked torch cache.

    ``cache``: ``(batch, 2, max_length, heads, head_dim)``, a view of the
    model's cache; ``key``, ``value``: ``(batch, steps, heads, head_dim)``.
    """
    index = int(index)
    steps = key.shape[1]
    cache[:, 0, index : index + steps] = key
    cache[:, 1, index : index + steps] = value
