"""JAX's compiled training step, with XLA's region analysis on the CPU.

Keras compiles the training step with its state donated, so that XLA may
write each updated variable over the old one. XLA's CPU compiler then
copies every variable at the start of the step, because its default copy
insertion cannot prove that the forward and backward passes read a
variable before the update writes over it: for the base model, 48M
parameters read and written once more per step.
``xla_cpu_copy_insertion_use_region_analysis`` asks it for the analysis
that proves it (XLA:GPU has the same option), and the copies go.

`make_train_function` is Keras's JAX ``make_train_function`` with that
compiler option: the same step function (`Model.train_step`), donation
and output shardings under a `keras.distribution`, compiled by
`jax.jit` with ``compiler_options``. Where it does not apply (not the
CPU, an XLA that refuses the option, eager or uncompiled training, Flax
NNX) it returns False and Keras builds the step.
"""

import functools

import jax
import keras
import numpy as np

CPU_TRAIN_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


@functools.cache
def cpu_train_options():
    """`CPU_TRAIN_OPTIONS` where JAX computes on the CPU and its XLA
    accepts them, else None."""
    if jax.default_backend() != "cpu":
        return None
    try:
        probe = jax.jit(lambda x: x + 1, compiler_options=CPU_TRAIN_OPTIONS)
        probe.lower(np.float32(0)).compile()
    except Exception:  # noqa: BLE001 - any refusal means "not here"
        return None
    return dict(CPU_TRAIN_OPTIONS)


def make_train_function(model):
    """Sets ``model.train_function`` to its compiled training step with
    `cpu_train_options`; returns whether it did (False: Keras's own
    `make_train_function` is to run)."""
    options = cpu_train_options()
    # The Trainer methods used below are Keras's, called as Keras's own
    # `make_train_function` calls them; a Keras without them trains as
    # Keras does.
    needed = ("_make_function", "_get_state_sharding_spec")
    if (
        options is None
        or model.run_eagerly
        or not model.jit_compile
        or keras.config.is_nnx_enabled()
        or not all(hasattr(model, name) for name in needed)
    ):
        return False
    out_shardings = None
    if keras.distribution.distribution() is not None:
        out_shardings = (None, model._get_state_sharding_spec())
    step = jax.jit(
        model.train_step,
        donate_argnums=0,
        out_shardings=out_shardings,
        compiler_options=options,
    )
    model.train_function = model._make_function(step)
    return True
