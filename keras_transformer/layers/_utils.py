import contextlib
import functools
import threading

import keras


def clone_initializer(initializer, salt=0):
    """A fresh copy of an initializer for one sublayer.

    A Keras initializer with an integer seed draws the same values at every
    call, so sublayers sharing it (or a plain copy of it) would start with
    identical weights. Each sublayer passes its own ``salt``, which derives
    a distinct seed; unseeded initializers are simply copied.
    """
    initializer = keras.initializers.get(initializer)
    config = initializer.get_config()
    if isinstance(config.get("seed"), int):
        config["seed"] = (config["seed"] * 1_000_003 + salt + 1) % 2**31
    return initializer.__class__.from_config(config)


def check_rate(name, value):
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name}={value} must be a dropout rate in [0, 1).")
    return float(value)


def check_positive(name, value):
    if int(value) != value or int(value) < 1:
        raise ValueError(f"{name}={value} must be a positive integer.")
    return int(value)


def jax_on_gpu():
    """Whether the backend is JAX and its first device is a GPU."""
    return keras.backend.backend() == "jax" and _first_jax_device() == "gpu"


def jax_on_cpu():
    """Whether the backend is JAX and its first device is a CPU."""
    return keras.backend.backend() == "jax" and _first_jax_device() == "cpu"


@functools.cache
def _first_jax_device():
    # "cpu:0" -> "cpu"
    return keras.distribution.list_devices()[0].split(":")[0]


def mask_for_fused_attention(mask, query_length, key_length):
    """``mask`` as `keras.ops.dot_product_attention` best takes it here.

    On a JAX GPU, Keras tries cuDNN's fused attention first. cuDNN takes
    only a mask as long as the queries: it refuses one that broadcasts
    over them (a padding mask), and Keras logs each refusal as an error
    before falling back to XLA. There the mask is broadcast over the
    queries; elsewhere it is returned unchanged.
    """
    if mask is None or not jax_on_gpu():
        return mask
    return keras.ops.broadcast_to(
        mask, (keras.ops.shape(mask)[0], 1, query_length, key_length)
    )


def apply_dropout(dropout, x, training):
    """``dropout(x, training=training)``, skipped when ``training`` is
    False, where a `keras.layers.Dropout` is the identity anyway.

    Skipping the call saves a Keras layer call per sublayer: on torch,
    which runs a decoding step eagerly, the bookkeeping of a layer call
    costs more than a one-token step's math. With ``training`` None
    (building a functional graph, or a call left to the layer's default)
    the layer is still called.
    """
    if training is False:
        return x
    return call_layer(dropout, x, training=training)


_direct = threading.local()


@contextlib.contextmanager
def direct_sublayer_calls(layer_calls=None, backend_ops=None):
    """Within this context, the layers of this package call their built
    sublayers' ``call`` directly instead of through `Layer.__call__`.

    For inference on torch, whose decoding runs eagerly (so that indices
    can also be read as Python ints, see `concrete_index`): there a
    one-token decoder step makes about a hundred layer calls, and the
    bookkeeping of `Layer.__call__` (input conversion, signature binding,
    training and mask resolution, name scopes) costs more than the step's
    arithmetic. For the calls made here, which pass tensors and
    ``training`` explicitly and use no Keras masks, that bookkeeping does
    not change the result when the layer computes in its variables'
    dtype and its input is already in that dtype. Everything else goes
    through `Layer.__call__`: quantized layers (its `quantized_call`),
    mixed-precision policies (its autocasting) and inputs to be cast
    (see `call_layer`). Also skipped, and unused in decoding: remat,
    distribution layouts of outputs and torch module hooks.

    The backend module that opens this context (`generation.compile`) may
    go one step further and pass its own implementations, for the same
    reason: a `keras.ops` call costs tens of microseconds of dtype
    bookkeeping on eager torch.

    Args:
        layer_calls: ``{layer class: fn(layer, *args, **kwargs)}``, used by
            `call_layer` in place of ``layer.call`` for layers of exactly
            that class; ``fn`` returns what ``layer.call`` would.
        backend_ops: ``{name: fn}``, returned by `backend_op` in place of
            ``keras.ops.<name>``; ``fn`` takes the arguments this package
            passes and returns what the op would. These apply inside
            every layer of this package, also those that `call_layer`
            sends through `Layer.__call__`.
    """
    previous = (
        getattr(_direct, "enabled", False),
        getattr(_direct, "layer_calls", {}),
        getattr(_direct, "backend_ops", {}),
        getattr(_direct, "memo", {}),
    )
    _direct.enabled = True
    _direct.layer_calls = dict(layer_calls or {})
    _direct.backend_ops = dict(backend_ops or {})
    _direct.memo = {}
    try:
        yield
    finally:
        (
            _direct.enabled,
            _direct.layer_calls,
            _direct.backend_ops,
            _direct.memo,
        ) = previous


def memoized(name, arguments, compute):
    """``compute()``, or inside `direct_sublayer_calls` on torch its
    result for the same ``name`` and ``arguments`` earlier in the context.

    For what every layer of a decoding step computes alike from the same
    tensors, such as its attention mask. Only ints, None and, on torch,
    Keras layers and torch tensors are compared: a layer by identity, a
    tensor by identity and by its version, which torch bumps at every
    in-place write, so a tensor changed in place is computed again. The
    memo keeps the layers and tensors referenced until the context ends,
    so no other object can take their identity. Any other argument (a
    NumPy array, another backend's tensor, whose code may be traced)
    computes afresh.
    """
    if not getattr(_direct, "enabled", False):
        return compute()
    key = [name]
    for argument in arguments:
        if argument is None or isinstance(argument, int):
            key.append(argument)
        elif isinstance(argument, keras.layers.Layer) and _on_torch():
            key.append(("layer", id(argument)))
        elif _is_torch_tensor(argument):
            key.append((id(argument), argument._version))
        else:
            return compute()
    key = tuple(key)
    entry = _direct.memo.get(key)
    if entry is None:
        entry = _direct.memo[key] = (arguments, compute())
    return entry[1]


def _on_torch():
    return keras.backend.backend() == "torch"


def _is_torch_tensor(value):
    if not _on_torch():
        return False
    import torch

    return isinstance(value, torch.Tensor)


def backend_op(name):
    """``keras.ops.<name>``, or the backend's own implementation passed to
    `direct_sublayer_calls` when inside it."""
    return backend_override(name) or getattr(keras.ops, name)


def backend_override(name):
    """The function ``name`` passed to `direct_sublayer_calls` when inside
    it, else None. Besides `keras.ops` names, this package asks for:

    - ``"write_cache_in_place"``: ``fn(cache, index, key, value)`` writes
      a self-attention step's keys and values into its cache at position
      ``index`` in place (the cache of an eager search is not read again
      at its earlier state), so a decoding step copies no cache.
    """
    if getattr(_direct, "enabled", False):
        return _direct.backend_ops.get(name)
    return None


def concrete_index(index):
    """``index`` as a Python int inside `direct_sublayer_calls`, where the
    computation runs eagerly and its value is known; otherwise unchanged.

    `ops.slice_update` on torch writes a cache with two kernels for int
    start indices, and builds index tensors for every axis otherwise.
    """
    if getattr(_direct, "enabled", False) and index is not None:
        return int(index)
    return index


def call_layer(layer, *args, **kwargs):
    """``layer(*args, **kwargs)``, or ``layer.call(*args, **kwargs)``
    inside `direct_sublayer_calls` when that gives the same result: the
    layer is built, not quantized, computes in its variables' dtype, and
    its first input is not a floating tensor of another dtype. A
    ``layer_calls`` entry of the context for the layer's class replaces
    ``layer.call``."""
    if getattr(_direct, "enabled", False) and _calls_directly(layer, args):
        call = _direct.layer_calls.get(type(layer))
        if call is not None:
            return call(layer, *args, **kwargs)
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


def _calls_directly(layer, args=()):
    policy = layer.dtype_policy
    if not (
        layer.built
        and policy.quantization_mode is None
        and policy.compute_dtype == policy.variable_dtype
    ):
        return False
    dtype = getattr(args[0], "dtype", None) if args else None
    if dtype is None:
        return True
    dtype = keras.backend.standardize_dtype(dtype)
    return dtype == policy.compute_dtype or "float" not in dtype
