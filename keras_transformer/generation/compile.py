"""Compiles a decoding function for the current Keras backend.

With `_torch_decoding`, the only modules of `generation` that import a
backend: each backend compiles a loop differently, and that difference
is kept here.

- JAX: `jax.jit`, with the model's variables passed in as arguments
  through a `keras.StatelessScope` (otherwise their values would be baked
  into the program as constants, and later weight updates ignored).
- TensorFlow: `tf.function`, with XLA (``jit_compile=True``) by default.
- PyTorch: eager, under `torch.no_grad()`, so that no autograd graph is
  recorded, and with `direct_sublayer_calls`, so that the model's layers
  skip `Layer.__call__`'s bookkeeping, which on a one-token step costs
  more than the arithmetic; within it, the layers a step calls most run
  as plain torch (`_torch_decoding`).
"""

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


def tensorflow_xla_on_cpu(jit_compile):
    """Whether `compile_function` compiles with TensorFlow's XLA for the
    CPU (``jit_compile`` on TensorFlow, and no GPU visible to it)."""
    if keras.backend.backend() != "tensorflow" or not jit_compile:
        return False
    import tensorflow as tf

    return not tf.config.list_logical_devices("GPU")


def torch_direct_calls():
    """The `direct_sublayer_calls` context of decoding on torch, with
    torch's own layer calls and ops (`_torch_decoding`). Torch backend
    only."""
    from keras_transformer.generation import _torch_decoding

    return _torch_decoding.direct_calls()
