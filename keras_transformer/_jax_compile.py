"""XLA options for `Transformer`'s compiled training step on JAX's CPU.

Keras compiles the training step with its state donated, so that XLA may
write each updated variable over the old one. XLA's CPU compiler then
copied every variable at the start of the step (for the base model,
48M parameters, about 190 MB read and written each step), because its
default copy insertion could not prove that the forward and backward
passes read a variable before the update writes over it.
``xla_cpu_copy_insertion_use_region_analysis`` asks it for the analysis
that proves it (XLA:GPU has the same option), and the copies go: 2% to
3% of a base training step on a 2-core CPU.

The option applies under a `keras.distribution` too: the distributed
tests (`DataParallel` and `ModelParallel` on 8 CPU devices) train with
it and match one device.

JAX only, imported by `Transformer.make_train_function` on JAX; kept
out of `models/`, which imports only Keras.
"""

import contextlib
import functools
import threading

import jax
import numpy as np

CPU_TRAIN_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}

_patching = threading.Lock()


@functools.cache
def cpu_train_options():
    """`CPU_TRAIN_OPTIONS` where JAX computes on the CPU and its XLA
    accepts them, else None. The options only speed the step up, so a
    JAX that cannot take them (an XLA without the option refuses the
    compile that names it; an older `jax.jit` has no
    ``compiler_options``) compiles as Keras does."""
    if jax.default_backend() != "cpu":
        return None
    try:
        probe = jax.jit(lambda x: x + 1, compiler_options=CPU_TRAIN_OPTIONS)
        probe.lower(np.float32(0)).compile()
    except Exception:  # noqa: BLE001 - any refusal means "not here"
        return None
    return dict(CPU_TRAIN_OPTIONS)


@contextlib.contextmanager
def train_step_options():
    """Within the block, Keras's JAX trainer compiles with
    `cpu_train_options` (nothing changes where those are None, or where
    Keras compiles with another function than `jax.jit`, as under Flax
    NNX). Keras's trainer module is shared by every model: the block
    holds a lock, so that two `Transformer`s built at once in two
    threads cannot restore Keras's `jit` under each other; another
    model built in another thread meanwhile may compile with the
    options, which change no value."""
    from keras.src.backend.jax import trainer

    options = cpu_train_options()
    with _patching:
        original = getattr(trainer, "jit", None)
        if options is None or original is not jax.jit:
            yield
            return
        trainer.jit = functools.partial(jax.jit, compiler_options=options)
        try:
            yield
        finally:
            trainer.jit = original
