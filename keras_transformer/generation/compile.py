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
  Each step writes its keys and values into the self-attention cache in
  place, instead of copying the whole cache as `ops.slice_update` does.
"""

import functools
import math

import keras


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
    back to ``layer.call``."""
    import torch
    import torch.nn.functional as F

    from keras_transformer.layers.multi_head_attention import _HeadsProjection

    linear = keras.activations.linear
    activations = {linear: None, keras.activations.relu: torch.relu}

    def value(variable):
        # `kernel` is a variable, or a tensor when LoRA is enabled.
        return getattr(variable, "value", variable)

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
        kernel = kernel.reshape(rows.shape[1], -1)
        if layer.bias is None:
            x = torch.mm(rows, kernel)
        else:
            bias = torch.broadcast_to(value(layer.bias), kept).reshape(-1)
            x = torch.addmm(bias, rows, kernel)
        return x.reshape(*inputs.shape[:-axes], *kept)

    def dense(layer, inputs, training=None):
        if layer.activation not in activations or inputs.dtype != torch.float32:
            return layer.call(inputs, training=training)
        kernel = value(layer.kernel)
        rows = inputs.reshape(-1, inputs.shape[-1])
        if layer.bias is None:
            x = torch.mm(rows, kernel)
        else:
            x = torch.addmm(value(layer.bias), rows, kernel)
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

    return {
        _HeadsProjection: heads_projection,
        keras.layers.Dense: dense,
        keras.layers.LayerNormalization: layer_norm,
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

    def write_cache_in_place(cache, index, key, value):
        # cache: (batch, 2, max_length, heads, head_dim), a view of the
        # model's cache; key, value: (batch, steps, heads, head_dim).
        index = int(index)
        steps = key.shape[1]
        cache[:, 0, index : index + steps] = key
        cache[:, 1, index : index + steps] = value

    return {
        "dot_product_attention": dot_product_attention,
        "write_cache_in_place": write_cache_in_place,
    }
