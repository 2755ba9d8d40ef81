"""The ``torch_decoder`` fast path: a search's cached decoder step, and
the encoding of its sources, as torch kernels.

Torch runs the search loop eagerly, and a one-token step of the base
decoder makes about a hundred Keras layer calls and as many `keras.ops`
calls, whose bookkeeping (argument conversion, dtype resolution, name
scopes) costs more than the step's arithmetic. `cached_decoder` returns
the step of `Transformer.decode` with a stacked cache as the arithmetic
it comes to: each decoder layer (section 3.1, post-norm as in 5.4, or
pre-norm) as one function of torch kernels, with its weights read once
per search:

- projections: one matrix product each (self-attention's query, key
  and value together, for they project the same rows), the bias added
  inside it: by
  `torch.addmm`, or with the ``onednn_matmul`` fast path by oneDNN's
  linear kernel (`_onednn_matmul`); for a model quantized to int8 by
  `Translator.quantize`, with the ``onednn_int8`` fast path, by oneDNN's
  int8 linear kernel, on the int8 values and scales that Keras's
  quantization made (`_int8_matmul`);
- layer normalizations: `F.layer_norm`;
- attention: `F.scaled_dot_product_attention`; each step writes its keys
  and values into the stacked cache in place, instead of copying the
  whole cache as `ops.slice_update` does, and attends over the positions
  written so far, not the whole buffer, which the causal mask would hide;
  the beams (or samples) of a source attend over one copy of its encoder
  output's keys and values, cut to its batch's longest source;
- the attention masks of a step: computed once for every layer.

The embeddings, positions (a table read once per search), final norm and
tied output projection are torch kernels too. So is the encoder that
fills a search's cross-attention cache (`encoder_layer`), for Keras's
int8 layers compute their integer products slowly on torch's CPU. A
model whose decoder is not what this module computes (float16 or
bfloat16, quantized layers without ``int8``, LoRA layers, a feed-forward
activation other than ReLU, SiLU or linear, other normalizations,
options it does not know) gets None, and its search runs
`Transformer.decode`.
"""

import functools
import inspect
import math
import typing
import weakref

import keras
import torch
import torch.nn.functional as F

from keras_transformer.layers.multi_head_attention import (
    attention_mask_of_call,
)

_LINEAR = keras.activations.linear
# Activations computed here, and the torch function of each: the
# functions Keras's torch backend calls for them. SiLU (swish) is the
# feed-forward activation of Marian (OPUS-MT) models.
_ACTIVATIONS = {
    _LINEAR: None,
    keras.activations.relu: torch.relu,
    keras.activations.silu: F.silu,
}
# The head projections' einsum equations, and how many input axes each
# contracts with the kernel: a matrix product.
_CONTRACTED_AXES = {"btd,dnh->btnh": 1, "btnh,nhd->btd": 2}

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


def cached_decoder(model, onednn=False, int8=False):
    """``decode(token_ids, cache, index, encoder_padding_mask,
    decoder_padding_mask=None) -> (logits, cache)``: `Transformer.decode`
    for a stacked or split cache (`Transformer.init_cache`), writing each
    step into ``cache`` in place; None where ``model``'s decoder is not
    what this module computes. With ``onednn``, the float matrix products
    are oneDNN's where torch has it (`products`); with ``int8``, the
    int8 layers of a model quantized by Keras are computed too, by
    oneDNN's int8 kernel (None where torch lacks it).

    The cross-attention cache may hold one row per source for several
    consecutive rows of ``token_ids`` (a source's beams or samples), which
    attend over it together; the padding mask has a row per row.

    The function has an attribute ``init_cache(source_ids, source_mask,
    max_length, stacked)``: `Transformer.init_cache` of the sources'
    `Transformer.encode` output, computed by the same kernels, without
    the trailing source columns that are padding in every row (None where
    the encoder is not what this module computes).

    The weights are read here as views of their variables, so weights
    assigned later in place are seen; self-attention's query, key and
    value kernels side by side are made again at the first step after
    one of them is assigned. int8 kernels are packed here (kept with
    their variables, and packed again after an assignment): call it
    again after assigning int8 weights, quantizing a model or enabling
    LoRA.
    """
    int8 = int8 and onednn_int8_is_exact()
    if model.compute_dtype != "float32":
        return None
    layers = [layer_weights(layer, int8) for layer in model.decoder_layers]
    ends = _ends(model, "decoder", int8)
    if ends is None or any(w is None for w in layers):
        return None
    matmul = products(onednn)

    def decode(
        token_ids,
        cache,
        index,
        encoder_padding_mask,
        decoder_padding_mask=None,
    ):
        index = int(index)
        token_ids = keras.ops.convert_to_tensor(token_ids, "int32")
        self_caches = _layer_caches(cache["self_attention"])
        cross_caches = _layer_caches(cache["cross_attention"])
        steps = token_ids.shape[1]
        masks = (
            _self_attention_mask(steps, index, decoder_padding_mask),
            _cross_attention_mask(
                cross_caches[0][0], token_ids.shape[0], encoder_padding_mask
            ),
        )
        x = _embedded(token_ids, ends, index)
        for weights, self_cache, cross_cache in zip(
            layers, self_caches, cross_caches, strict=True
        ):
            x = decoder_step(
                weights, x, masks, self_cache, index, cross_cache, matmul
            )
        if ends["final_norm"] is not None:
            x = _normalize(x, ends["final_norm"])
        # The pre-softmax projection shares the embedding matrix (3.4);
        # the bias is added inside the product.
        rows = x.reshape(-1, x.shape[-1])
        logits = matmul(rows, ends["projection"], ends["bias"])
        return logits.view(*x.shape[:-1], -1), cache

    decode.init_cache = _cross_attention_cache(model, int8, layers, matmul)
    return decode


def _layer_caches(cache):
    """Each decoder layer's ``(keys, values)``, ``(batch, heads, length,
    head_dim)`` views of a stacked cache, ``(batch, layers, 2, length,
    heads, head_dim)``, or the pairs of a split one."""
    if isinstance(cache, (tuple, list)):
        return cache
    return [
        (cache[:, i, 0].transpose(1, 2), cache[:, i, 1].transpose(1, 2))
        for i in range(cache.shape[1])
    ]


def _cross_attention_mask(keys, rows, encoder_padding_mask):
    """The padding mask of the sources whose cross-attention ``keys``
    (``(sources, heads, length, head_dim)``) serve ``rows`` rows,
    ``(sources, 1, 1, length)``: each source's row of
    ``encoder_padding_mask`` (one per row, the copies of a source
    consecutive), up to the cached length."""
    sources, _, length, _ = keys.shape
    if rows % sources:
        raise ValueError(
            f"A cross-attention cache of {sources} sources cannot serve "
            f"{rows} rows: each source needs the same number of rows."
        )
    if encoder_padding_mask is None:
        return None
    mask = keras.ops.convert_to_tensor(encoder_padding_mask)
    return attention_mask_of_call(1, length, mask[:: rows // sources, :length])


def _self_attention_mask(steps, index, decoder_padding_mask):
    """The self-attention mask of a step over the cached positions it can
    see, ``[0, index + steps)``: the positions after them are hidden by
    the causal mask (section 3.2.3), so the step attends over these
    alone. None for one step without a padding mask, which sees all of
    them."""
    if steps == 1 and decoder_padding_mask is None:
        return None
    length = index + steps
    if decoder_padding_mask is not None:
        decoder_padding_mask = decoder_padding_mask[:, :length]
    return attention_mask_of_call(
        steps,
        length,
        decoder_padding_mask,
        use_causal_mask=True,
        cache_update_index=index,
    )


def _ends(model, side, int8):
    """What the layers of a ``side`` (``"encoder"`` or ``"decoder"``)
    need around them: its token embeddings, their scale, the position
    table and the final norm's parameters; for the decoder also the
    output projection (its embedding matrix, tied) and the logits bias.
    None for an untied output projection, an int8 embedding without
    ``int8``, or a final norm this module does not compute."""
    embedding = getattr(model, f"{side}_token_embedding")
    norm = getattr(model, f"{side}_final_norm")
    if norm is not None and not (
        _plain(norm) and not norm.rms_scaling and norm.axis in (-1, [-1])
    ):
        return None
    if embedding.quantization_mode is None:
        embeddings = _value(embedding.embeddings)
    elif embedding.quantization_mode == "int8" and int8:
        # Keras's int8 embedding scheme: values over a scale per token.
        embeddings = _Int8Embeddings(
            _value(embedding.embeddings), _value(embedding.embeddings_scale)
        )
    else:
        return None
    positions = getattr(model, f"{side}_position_encoding")(
        torch.zeros((1, model.max_sequence_length, model.hidden_dim))
    )[0]
    ends = {
        "embeddings": embeddings,
        "scale": math.sqrt(model.hidden_dim) if embedding.scale else 1.0,
        "positions": positions,
        "final_norm": None
        if norm is None
        else (
            _optional_value(norm.gamma),
            _optional_value(norm.beta),
            norm.epsilon,
        ),
    }
    if side == "encoder":
        return ends
    if model.output_projection is not None:
        return None
    if isinstance(embeddings, _Int8Embeddings):
        ends["projection"] = _int8_matrix(*embeddings)
    else:
        ends["projection"] = embeddings.t()
    ends["bias"] = (
        None if model.output_bias is None else _value(model.output_bias.bias)
    )
    return ends


def _embedded(token_ids, ends, start=0):
    """Embeddings x sqrt(d_model) plus positions (3.4, 3.5)."""
    x = _embed(token_ids, ends["embeddings"]) * ends["scale"]
    return x + ends["positions"][start : start + token_ids.shape[1]]


def _cross_attention_cache(model, int8, layers, matmul):
    """``init_cache(source_ids, source_mask, max_length, stacked)``:
    `Transformer.init_cache` of `Transformer.encode`'s output, the encoder
    and the decoder layers' cross-attention keys and values computed here
    (section 3.2.3: they attend over the encoder output); None where the
    encoder is not what this module computes."""
    encoder = [layer_weights(layer, int8) for layer in model.encoder_layers]
    ends = _ends(model, "encoder", int8)
    if ends is None or any(w is None for w in encoder):
        return None

    def init_cache(source_ids, source_mask, max_length, stacked):
        source_ids, source_mask = _unpadded(source_ids, source_mask)
        batch, length = source_ids.shape
        x = _embedded(source_ids, ends)
        mask = attention_mask_of_call(length, length, source_mask)
        for weights in encoder:
            x = encoder_layer(weights, x, mask, matmul)
        if ends["final_norm"] is not None:
            x = _normalize(x, ends["final_norm"])
        rows = x.reshape(batch * length, -1)
        cross = tuple(
            tuple(
                _heads(rows, projection, batch, heads, matmul)
                for projection in w["cross_attention_keys_values"]
            )
            for w in layers
            for heads in [w["cross_attention_heads"]]
        )
        heads = (model.num_heads, model.hidden_dim // model.num_heads)
        shape = (batch, heads[0], max_length, heads[1])
        zeros = [(torch.zeros(shape), torch.zeros(shape)) for _ in layers]
        if not stacked:
            return {"self_attention": tuple(zeros), "cross_attention": cross}
        # (batch, layers, 2, length, heads, head_dim)
        return {
            "self_attention": _stacked(zeros),
            "cross_attention": _stacked(cross),
        }

    return init_cache


def _unpadded(source_ids, source_mask):
    """The sources without the trailing columns that are padding in every
    row: nothing attends to them (section 3.2.3), so the encoder output
    at the other positions, and the search, are the same without them.
    Kept where a row is all padding, which attends to every column
    (`attention_mask_of_call`)."""
    source_ids = keras.ops.convert_to_tensor(source_ids, "int32")
    if source_mask is None:
        return source_ids, None
    source_mask = keras.ops.convert_to_tensor(source_mask)
    if not bool(source_mask.any(1).all()):
        return source_ids, source_mask
    visible = torch.nonzero(source_mask.any(0))
    length = int(visible[-1, 0]) + 1
    return source_ids[:, :length], source_mask[:, :length]


def _stacked(pairs):
    """A stacked cache of the ``(keys, values)`` pairs of a split one."""
    return torch.stack(
        [
            torch.stack([k.transpose(1, 2), v.transpose(1, 2)], 1)
            for k, v in pairs
        ],
        1,
    )


# --- helpers


def _value(variable):
    # `kernel` is a variable, or a tensor when LoRA is enabled.
    return getattr(variable, "value", variable)


def _optional_value(variable):
    return None if variable is None else _value(variable)


def float_product(onednn):
    """The float matrix product of the decoder step: `_onednn_matmul`
    where ``onednn`` is asked for and this torch has oneDNN's linear
    kernel, else `_matmul`."""
    if onednn and _has_onednn_linear():
        return _onednn_matmul
    return _matmul


def products(onednn):
    """The matrix product of the decoder step, ``matmul(rows, kernel,
    bias)``: `_int8_matmul` for an `_Int8Matrix` kernel, else
    `float_product`."""
    float_matmul = float_product(onednn)

    def matmul(rows, kernel, bias):
        if isinstance(kernel, _Int8Matrix):
            return _int8_matmul(rows, kernel, bias)
        return float_matmul(rows, kernel, bias)

    return matmul


def _has_onednn_linear():
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_linear_pointwise"
    )


def _matmul(rows, kernel, bias):
    """``rows @ kernel + bias``, the bias added inside the product."""
    if bias is None:
        return torch.mm(rows, kernel)
    return torch.addmm(bias, rows, kernel)


def _onednn_matmul(rows, kernel, bias):
    """``rows @ kernel + bias`` by oneDNN's linear kernel, a private op
    of torch's. `torch.addmm` calls the BLAS torch was built with (MKL),
    which takes slower code on some CPUs (AMD's among them) for the
    few-row products of a decoding step; oneDNN picks its code by the
    instructions the CPU has. The kernel is read as ``kernel.t()``, a
    view: nothing is copied."""
    return torch.ops.mkldnn._linear_pointwise(
        rows, kernel.t(), bias, "none", [], ""
    )


@functools.cache
def onednn_int8_is_exact():
    """Whether this torch has oneDNN's int8 linear kernel and its integer
    products are exact on this CPU, as `_int8_matmul` needs. With VNNI
    instructions they are. Without them (AVX2 alone) the kernel adds
    pairs of uint8 x int8 products in 16 bits, which overflow for the
    large offset integers that `_int8_matmul` gives it (255 x 127 twice
    is over 32,767): the results are wrong, and the fast path must not
    run. Checked once, on the largest integers and on random ones."""
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.onednn, "qlinear_pointwise")
    ):
        return False
    generator = torch.Generator().manual_seed(0)
    integers = torch.randint(-127, 128, (8, 64), generator=generator)
    weight = torch.randint(-127, 128, (16, 64), generator=generator)
    integers[0], weight[0] = 127, 127
    kernel = _Int8Matrix(
        torch.ops.onednn.qlinear_prepack(weight.to(torch.int8), None),
        torch.ones(16),
        torch.zeros(16, dtype=torch.int32),
    )
    products = _onednn_int8_products((integers + 128).to(torch.uint8), kernel)
    return bool(torch.equal(products, (integers @ weight.t()).float()))


class _Int8Matrix(typing.NamedTuple):
    """An int8 ``(inputs, outputs)`` kernel as oneDNN's int8 linear
    kernel reads it (`_int8_matrix`)."""

    packed: torch.Tensor
    # Per output unit: 1 / Keras's scale, and zero points (all 0).
    scale: torch.Tensor
    zero_points: torch.Tensor


class _Int8Embeddings(typing.NamedTuple):
    """A Keras int8 embedding matrix: ``values / scale[:, None]``."""

    values: torch.Tensor
    scale: torch.Tensor


def _embed(token_ids, embeddings):
    if isinstance(embeddings, _Int8Embeddings):
        values = F.embedding(token_ids, embeddings.values).float()
        return values / embeddings.scale[token_ids].unsqueeze(-1)
    return F.embedding(token_ids, embeddings)


def _kept(owner, name, sources, make):
    """``make()``, kept on the tensor ``owner`` under ``name`` and made
    again when one of the tensors ``sources`` it is made of has been
    written since (torch counts in-place writes, such as a variable's
    assign, in ``_version``) or replaced by another tensor."""
    kept = getattr(owner, "_keras_transformer_kept", None)
    if kept is None:
        kept = owner._keras_transformer_kept = {}
    state = [(weakref.ref(t), t._version) for t in sources]
    known = kept.get(name)
    if known is not None and all(
        ref() is t and version == t._version
        for (ref, version), t in zip(known[0], sources, strict=True)
    ):
        return known[1]
    value = make()
    kept[name] = (state, value)
    return value


def _int8_matrix(values, scale, input_axes=None):
    """`_Int8Matrix` of Keras int8 variables ``values`` with ``scale``,
    their float scale per output unit (values = float x scale): kernels
    whose first ``input_axes`` axes are their inputs, or (``input_axes``
    None) an embedding matrix, ``(outputs, inputs)``. ``values`` and
    ``scale`` may be lists of kernels with the same inputs, whose outputs
    are concatenated: one product computes them all.

    Packing the output projection of a large vocabulary takes a large
    part of a search, so the packing is kept on the first variable's
    tensor (`_kept`).
    """
    values, scale = (x if isinstance(x, list) else [x] for x in (values, scale))

    def pack():
        weights = [
            v
            if input_axes is None
            else v.reshape(math.prod(v.shape[:input_axes]), -1).t()
            for v in values
        ]
        weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        scales = torch.cat([s.detach().reshape(-1) for s in scale])
        return _Int8Matrix(
            torch.ops.onednn.qlinear_prepack(weight.contiguous(), None),
            1.0 / scales,
            torch.zeros(weight.shape[0], dtype=torch.int32),
        )

    return _kept(values[0], f"onednn_int8_{len(values)}", values + scale, pack)


def _int8_matmul(rows, kernel, bias):
    """``rows @ kernel + bias`` as Keras's int8 ``Dense`` computes it:
    the rows quantized to int8 by their abs-max (a scale per row), an
    integer product with the int8 kernel, and the two scales divided
    out. oneDNN's kernel takes one input scale and zero point for all
    rows, so it gets the same integers offset by 128, as uint8 with zero
    point 128 and scale 1, and each row's scale divides its output
    after."""
    row_scale = 127.0 / (
        rows.abs().amax(dim=-1, keepdim=True) + keras.config.epsilon()
    )
    # Keras clips the integers to [-127, 127], where a row's abs-max
    # scaling already puts them.
    integers = torch.mul(rows, row_scale).round_().add_(128)
    products = _onednn_int8_products(integers.to(torch.uint8), kernel)
    if bias is None:
        return products.div_(row_scale)
    return torch.addcdiv(bias, products, row_scale)


def _onednn_int8_products(offset_integers, kernel):
    """The integer products of int8 rows given as uint8 with offset 128
    and the int8 ``kernel`` (an `_Int8Matrix`), times its scale, by
    oneDNN's int8 linear kernel: float32 ``(rows, outputs)``."""
    return torch.ops.onednn.qlinear_pointwise(
        offset_integers,
        1.0,
        128,
        kernel.packed,
        kernel.scale,
        kernel.zero_points,
        None,
        1.0,
        0,
        torch.float32,
        "none",
        [],
        "",
    )


def _projection_matrix(layer):
    """A head projection's kernel as an ``(inputs, outputs)`` matrix,
    and its bias as one row (or None): views of the variables, or an
    `_Int8Matrix`."""
    axes = _CONTRACTED_AXES[layer.equation]
    kernel = _value(layer.kernel)
    matrix = _dense_matrix(layer, axes)
    if layer.bias is None:
        return matrix, None
    kept = kernel.shape[axes:]
    return matrix, torch.broadcast_to(_value(layer.bias), kept).reshape(-1)


def _concatenated_projections(layers):
    """``current()``: the head projections ``layers``, which project the
    same rows (self-attention's query, key and value), as one ``(inputs,
    outputs)`` matrix (or `_Int8Matrix`) and bias row whose outputs are
    theirs side by side, so that one product computes them all. The
    concatenation is kept with the variables (`_kept`) and ``current``
    makes it again after one of them is assigned, so a step reads the
    weights as they are. None where some are quantized and others not."""
    modes = {layer.quantization_mode for layer in layers}
    if len(modes) > 1:
        return None
    quantized = modes != {None}
    axes = _CONTRACTED_AXES[layers[0].equation]

    def variables():
        values = [_value(layer.kernel) for layer in layers]
        values += [
            _value(layer.bias) for layer in layers if layer.bias is not None
        ]
        if quantized:
            values += [_value(layer.kernel_scale) for layer in layers]
        return values

    def concatenate():
        kernels = [_value(layer.kernel) for layer in layers]
        if quantized:
            scales = [_value(layer.kernel_scale) for layer in layers]
            matrix = _int8_matrix(kernels, scales, axes)
        else:
            matrix = torch.cat([_matrix(k, axes) for k in kernels], 1)
        if all(layer.bias is None for layer in layers):
            return matrix, None
        biases = [
            torch.zeros(k.shape[axes:])
            if layer.bias is None
            else torch.broadcast_to(_value(layer.bias), k.shape[axes:])
            for layer, k in zip(layers, kernels, strict=True)
        ]
        return matrix, torch.cat([b.reshape(-1) for b in biases])

    def current():
        sources = variables()
        return _kept(sources[0], "concatenated", sources, concatenate)

    return current


def _matrix(kernel, input_axes):
    return kernel.reshape(math.prod(kernel.shape[:input_axes]), -1)


def _dense_matrix(layer, input_axes=1):
    """The kernel of a ``Dense`` or ``EinsumDense`` layer whose first
    ``input_axes`` axes are its inputs, as an ``(inputs, outputs)``
    matrix (a view), or an `_Int8Matrix` where the layer is quantized to
    int8."""
    kernel = _value(layer.kernel)
    if layer.quantization_mode is not None:
        return _int8_matrix(kernel, _value(layer.kernel_scale), input_axes)
    return _matrix(kernel, input_axes)


# --- the decoder layer step


def _plain(layer, int8=False):
    """Whether ``layer.call`` computes ``layer``: built, not quantized
    (or quantized to int8, with ``int8``), in its variables' dtype."""
    policy = layer.dtype_policy
    return (
        layer.built
        and policy.quantization_mode in ((None, "int8") if int8 else (None,))
        and policy.compute_dtype == policy.variable_dtype
    )


def layer_weights(layer, int8=False):
    """What `decoder_step` needs of a `TransformerDecoderLayer`, or
    `encoder_layer` of a `TransformerEncoderLayer`: its matrices and bias
    rows, layer norm parameters, feed-forward activation, head counts and
    norm order. The tensors are views of the variables, so weights
    assigned later are seen (Keras assigns torch variables in place);
    self-attention's query, key and value come as a function giving
    their concatenation as it is now (`_concatenated_projections`).

    None where a sublayer is not what those functions compute: not
    float32, quantized (to anything but int8, or at all without
    ``int8``), with LoRA, another activation or another normalization;
    where only some of the query, key and value are quantized; and for a
    layer with options it does not know.
    """
    cross = getattr(layer, "cross_attention", None)
    attentions = [layer.self_attention] + ([cross] if cross else [])
    feed_forward = layer.feed_forward
    intermediate = feed_forward.intermediate_dense
    projections = [
        projection
        for attention in attentions
        for projection in (
            attention.query_dense,
            attention.key_dense,
            attention.value_dense,
            attention.output_dense,
        )
    ]
    norms = [layer.self_attention_norm, layer.feed_forward_norm]
    if cross:
        norms.insert(1, layer.cross_attention_norm)
    sublayers = [*attentions, feed_forward, intermediate]
    sublayers += [feed_forward.output_dense, *projections, *norms]
    if not (
        _options(layer) <= _DECODER_CONFIG
        and all(
            _plain(sublayer, int8)
            and sublayer.compute_dtype == "float32"
            and not getattr(sublayer, "lora_enabled", False)
            for sublayer in sublayers
        )
        and all(
            p.activation is _LINEAR and p.equation in _CONTRACTED_AXES
            for p in projections
        )
        and feed_forward.output_dense.activation is _LINEAR
        and intermediate.activation in _ACTIVATIONS
        and all(
            not norm.rms_scaling and norm.axis in (-1, [-1]) for norm in norms
        )
    ):
        return None

    # Self-attention's query, key and value: one product (their inputs
    # are the same rows); cross-attention's keys and values are the
    # encoder output's (`init_cache`).
    query_key_value = _concatenated_projections(projections[:3])
    if query_key_value is None:
        return None
    matrices = [_projection_matrix(p) for p in projections[3:]]

    def dense(layer):
        return _dense_matrix(layer), _optional_value(layer.bias)

    def heads(attention):
        return attention.num_heads, attention.head_dim

    weights = {
        "self_attention": [query_key_value, matrices[0]],
        "self_attention_heads": heads(layer.self_attention),
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
    if cross:
        query, key, value, output = matrices[1:]
        weights["cross_attention"] = [query, output]
        weights["cross_attention_keys_values"] = [key, value]
        weights["cross_attention_heads"] = heads(cross)
    return weights


def encoder_layer(weights, x, mask, matmul=_matmul):
    """`TransformerEncoderLayer.call` at inference as the arithmetic it
    comes to, as `decoder_step` computes a decoder layer. ``x``:
    ``(batch, length, width)``; ``mask``: the boolean self-attention mask
    of the sources' padding. Returns ``(batch, length, width)``."""
    batch, length, width = x.shape
    self_norm, feed_forward_norm = weights["norms"]
    first = weights["normalize_first"]

    def self_attention(rows):
        query_key_value, output = weights["self_attention"]
        heads = weights["self_attention_heads"]
        attended = _dot_product_attention(
            *_heads(rows, query_key_value(), batch, heads, matmul, parts=3),
            mask,
            _scale(heads),
        )
        return matmul(attended.reshape(batch * length, -1), *output)

    rows = x.reshape(batch * length, width)
    rows = _residual(rows, self_norm, first, self_attention)
    rows = _residual(
        rows,
        feed_forward_norm,
        first,
        lambda r: _feed_forward(r, weights, matmul),
    )
    return rows.view(batch, length, width)


def _residual(rows, norm, normalize_first, sublayer):
    # Vaswani et al., 2017, 5.4: LayerNorm(x + Sublayer(x)); or pre-norm.
    if normalize_first:
        return rows + sublayer(_normalize(rows, norm))
    return _normalize(rows + sublayer(rows), norm)


def _feed_forward(rows, weights, matmul):
    # Section 3.3: max(0, x W_1 + b_1) W_2 + b_2 (or another activation).
    hidden = matmul(rows, *weights["intermediate"])
    if weights["activation"] is not None:
        hidden = weights["activation"](hidden)
    return matmul(hidden, *weights["output"])


def decoder_step(weights, x, masks, cache, index, cross_cache, matmul=_matmul):
    """`TransformerDecoderLayer.call` with a self-attention cache, at
    inference, as the arithmetic it comes to: the torch kernels of the
    sublayer calls above, on ``(batch * steps, width)`` rows.

    ``x``: ``(batch, steps, width)``; ``masks``: the boolean self- and
    cross-attention masks of the step, the former over the cached
    positions ``[0, index + steps)`` (`_self_attention_mask`);
    ``cache``: this layer's keys and values, ``(batch, heads, max_length,
    head_dim)`` each (views of the model's cache), written at ``index``
    in place; ``cross_cache``: the encoder output's, ``(sources, heads,
    source_length, head_dim)`` each (`_layer_caches`), where each source
    serves ``batch / sources`` consecutive rows, and the cross-attention
    mask is ``(sources, 1, 1, source_length)``; ``matmul``: the matrix
    product (`products`).
    Returns the layer's output, ``(batch, steps, width)``.
    """
    batch, steps, width = x.shape
    self_norm, cross_norm, feed_forward_norm = weights["norms"]
    self_mask, cross_mask = masks

    def residual(rows, norm, sublayer):
        return _residual(rows, norm, weights["normalize_first"], sublayer)

    def self_attention(rows):
        query_key_value, output = weights["self_attention"]
        heads = weights["self_attention_heads"]
        keys, values = cache
        query, key, value = _heads(
            rows, query_key_value(), batch, heads, matmul, parts=3
        )
        # The positions written so far; `self_mask` covers them alone.
        length = index + steps
        # (batch, heads, steps, head_dim), written in place.
        keys[:, :, index:length] = key
        values[:, :, index:length] = value
        attended = _dot_product_attention(
            query,
            keys[:, :, :length],
            values[:, :, :length],
            self_mask,
            _scale(heads),
        )
        return matmul(attended.reshape(batch * steps, -1), *output)

    def cross_attention(rows):
        query, output = weights["cross_attention"]
        heads = weights["cross_attention_heads"]
        # The rows of a source (its beams or samples) attend over its one
        # copy of the encoder output's keys and values together.
        sources = cross_cache[0].shape[0]
        attended = _dot_product_attention(
            _heads(rows, query, sources, heads, matmul),
            *cross_cache,
            cross_mask,
            _scale(heads),
        )
        return matmul(attended.reshape(batch * steps, -1), *output)

    rows = x.reshape(batch * steps, width)
    rows = residual(rows, self_norm, self_attention)
    rows = residual(rows, cross_norm, cross_attention)
    rows = residual(
        rows, feed_forward_norm, lambda r: _feed_forward(r, weights, matmul)
    )
    return rows.view(batch, steps, width)


def _scale(heads):
    # As `MultiHeadAttention` computes it: 1 / sqrt(d_k).
    return 1.0 / math.sqrt(heads[1])


def _normalize(rows, norm):
    gamma, beta, epsilon = norm
    return F.layer_norm(rows, rows.shape[-1:], gamma, beta, epsilon)


# --- ops


def _heads(rows, projection, batch, heads, matmul, parts=1):
    """A head projection of ``(batch * steps, width)`` rows, ``(batch,
    heads, steps, head_dim)``; for a projection of ``parts`` concatenated
    ones (query, key and value), a tuple of them."""
    projected = matmul(rows, *projection).view(batch, -1, parts, *heads)
    split = [x.transpose(1, 2) for x in projected.unbind(2)]
    return split[0] if parts == 1 else tuple(split)


def _dot_product_attention(query, key, value, mask=None, scale=None):
    # (batch, heads, length, head_dim) in, (batch, length, heads,
    # head_dim) out, as in Keras; a boolean mask (True attends), which
    # `MultiHeadAttention` never leaves without a visible key in a row.
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale
    )
    return output.transpose(1, 2)


def _options(layer):
    """The names of ``layer``'s config, read from its constructor's
    signature: `get_config` serializes the dtype policy through Keras,
    which imports TensorFlow wherever it is installed."""
    parameters = inspect.signature(type(layer).__init__).parameters
    names = {
        name
        for name, parameter in parameters.items()
        if name != "self"
        and parameter.kind
        not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }
    return names | {"name", "trainable", "dtype"}
