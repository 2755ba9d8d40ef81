"""The ``jax_dropout`` fast path: the dropout masks of `layers.Dropout`
as threefry bits from XLA.

Keras's JAX dropout draws its mask with `jax.random.bernoulli`, which
computes threefry-2x32 as JAX-level integer operations for every element
and converts the bits to floats to compare with the keep probability.
`lax.rng_bit_generator` with the threefry algorithm gives XLA the whole
draw as one operation, which its CPU compiler vectorizes; the bits are
compared with the keep probability as integers. XLA expands the
algorithm itself, so its bits are not promised to stay the same across
XLA versions, as `jax.random`'s are.

Chosen by `backends.dropout_function` on JAX's CPU without a
`keras.distribution`.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax


def dropout(inputs, rate, noise_shape, seed):
    """``inputs`` with each element (or each element of ``noise_shape``,
    broadcast) kept with probability ``1 - rate`` and scaled by ``1 / (1 -
    rate)``, others zero.

    ``seed``: a Keras seed, ``uint32[2]``; it is the 64-bit threefry key,
    and the counter starts at 0. ``rate`` must be in ``(0, 1)``.
    """
    shape = _mask_shape(inputs.shape, noise_shape)
    key = jnp.concatenate(
        [jnp.asarray(seed, jnp.uint32).reshape(2), jnp.zeros(2, jnp.uint32)]
    )
    threefry = lax.RandomAlgorithm.RNG_THREE_FRY
    _, bits = lax.rng_bit_generator(
        key, shape, dtype=jnp.uint32, algorithm=threefry
    )
    # P(bits >= threshold) = 1 - threshold / 2**32, within 2**-33 of
    # 1 - rate.
    threshold = np.uint32(min(round(rate * 2**32), 2**32 - 1))
    keep = jnp.broadcast_to(bits >= threshold, inputs.shape)
    keep_probability = 1.0 - rate
    return lax.select(keep, inputs / keep_probability, jnp.zeros_like(inputs))


def _mask_shape(input_shape, noise_shape):
    if noise_shape is None:
        return tuple(input_shape)
    return tuple(
        size if kept is None else kept
        for size, kept in zip(input_shape, noise_shape, strict=True)
    )
