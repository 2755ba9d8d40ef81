"""How a search loop is compiled on each backend.

- JAX: `jax.jit`, with the model's variables passed in as arguments
  through a `keras.StatelessScope` (otherwise their values would be baked
  into the program as constants, and later weight updates ignored).
- TensorFlow: `tf.function`, with XLA (``jit_compile=True``) by default.
- torch: eager, under `torch.no_grad()`, so that no autograd graph is
  recorded.
"""

import keras

from keras_transformer import backends


def compile_search(fn, model, jit_compile=True):
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
        return _jax_function(fn, model)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=jit_compile)
    if backend == "torch":
        import torch

        def run(*args):
            with torch.no_grad():
                return fn(*args)

        return run
    raise NotImplementedError(
        f"Decoding supports the tensorflow, jax and torch backends; the "
        f"Keras backend is {backend!r}. Set KERAS_BACKEND to one of them."
    )


def _jax_function(fn, model):
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


def search_rows(rows_per_source, use_cache, jit_compile):
    """The fewest sources a compiled search runs at once: 1, or 2 where
    the ``tensorflow_filler_row`` fast path applies.

    Searched alone with the cache, one source with one hypothesis
    (greedy search, one sample) makes every decoder step multiply a
    single row by the weights. TensorFlow's XLA for the CPU fuses each
    of those products with its bias into a vector-matrix loop of its
    own, where it hands two rows to its matrix library, which is faster.
    There a lone source is searched beside a filler row, and finds what
    it finds in a batch (its logits can differ in the last bits from a
    one-row program's, as any two batch sizes' can).
    """
    one_row = use_cache and rows_per_source == 1
    if not (
        one_row and jit_compile and backends.enabled("tensorflow_filler_row")
    ):
        return 1
    import tensorflow as tf

    return 1 if tf.config.list_logical_devices("GPU") else 2
