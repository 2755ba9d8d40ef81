"""Small helpers shared across the package: initializers, setting checks."""

import dataclasses
import math
import numbers

import keras
import numpy as np


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


def describe(value):
    """``value`` as a message shows it: its repr and its type, so that
    ``'64'`` (a str) is not mistaken for ``64`` (an int)."""
    if value is None:
        return "None"
    kind = type(value).__name__
    article = "an" if kind[:1] in "aeiou" else "a"
    return f"{value!r} ({article} {kind})"


def _is_number(value):
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
    )


def check_rate(name, value):
    """``value`` as a float dropout rate in [0, 1), or a ValueError naming
    ``name`` and the value with its type."""
    if not _is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(
            f"{name}={describe(value)} must be a dropout rate: a number "
            "in [0, 1), e.g. 0.1."
        )
    return float(value)


def check_positive(name, value):
    """``value`` as a positive int, or a ValueError naming ``name`` and
    the value with its type (``hidden_dim='64' (a str)``)."""
    if not _is_number(value) or int(value) != value or value < 1:
        raise ValueError(
            f"{name}={describe(value)} must be a positive integer (an "
            "int of at least 1)."
        )
    return int(value)


def check_positive_float(name, value):
    """``value`` as a positive finite float, or a ValueError naming it."""
    if not _is_number(value) or value <= 0:
        raise ValueError(
            f"{name}={describe(value)} must be a positive, finite number."
        )
    return float(value)


def check_bool(name, value):
    """``value`` as a bool, or a ValueError naming it: a str such as
    ``"False"`` would otherwise be taken as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"{name}={describe(value)} must be True or False (a bool)."
        )
    return bool(value)


def replace_settings(settings, overrides, what, error=ValueError):
    """``dataclasses.replace(settings, **overrides)``, raising ``error``
    that names the unknown keys and the known ones instead of a bare
    TypeError from the constructor."""
    fields = sorted(f.name for f in dataclasses.fields(settings))
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise error(f"Unknown {what} {unknown}; the settings are {fields}.")
    return dataclasses.replace(settings, **overrides)


# --- checks of token ids and padding masks where their values are known


def host_values(x):
    """``x`` as a NumPy array when its values are known now, else None.

    NumPy arrays, lists and eager tensors have values; a `keras.Input`
    and the tensors that `jax.jit` or `tf.function` trace do not (their
    values exist only when the compiled function runs), so they are not
    checked here.
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, keras.KerasTensor):
        return None
    try:
        if not keras.ops.is_tensor(x):
            return np.asarray(x)
        return keras.ops.convert_to_numpy(x)
    except (TypeError, ValueError, NotImplementedError):
        # A traced tensor (JAX raises a TypeError, TensorFlow a
        # NotImplementedError), or a ragged list Keras will refuse.
        return None


def _first_true(bad):
    """The index tuple of the first True of ``bad`` in row-major order,
    or None."""
    if not bad.any():
        return None
    return np.unravel_index(int(np.argmax(bad)), bad.shape)


def _position(name, index):
    return f"{name}[{', '.join(str(int(i)) for i in index)}]"


def _scalar(value):
    """A NumPy scalar as messages show it: an int when whole, else in the
    shortest form of its own precision (5.7, not 5.699999809265137)."""
    if float(value).is_integer():
        return int(value)
    return str(value)


def first_invalid_token_id(ids, vocabulary_size):
    """The index of the first entry of the NumPy array ``ids`` that is
    not a token id (a whole number in ``[0, vocabulary_size)``), or None.

    A ValueError for arrays that are not numbers at all."""
    if ids.dtype == bool or np.issubdtype(ids.dtype, np.integer):
        # The common case costs one min and one max.
        if ids.size == 0 or (
            ids.min() >= 0 and int(ids.max()) < vocabulary_size
        ):
            return None
        return _first_true((ids < 0) | (ids >= vocabulary_size))
    if not np.issubdtype(ids.dtype, np.floating):
        raise ValueError(
            f"token ids have dtype {ids.dtype}; they must be integers in "
            f"[0, {vocabulary_size})."
        )
    valid = (ids >= 0) & (ids < vocabulary_size) & (ids == np.floor(ids))
    return _first_true(~valid)


def check_token_ids(name, ids, vocabulary_size, fix):
    """Raises a ValueError naming the first entry of ``ids`` that is not
    a token id: negative, not below ``vocabulary_size`` (an embedding
    lookup then reads no row: NaN on JAX, a crash on torch) or not a
    whole number. ``fix`` ends the message. Symbolic tensors pass.

    Example message: ``encoder_token_ids[3, 17] = 8123 is outside
    [0, 8000): ...``.
    """
    values = host_values(ids)
    if values is None:
        return
    try:
        index = first_invalid_token_id(values, vocabulary_size)
    except ValueError as error:
        raise ValueError(f"{name}: {error} {fix}") from None
    if index is None:
        return
    value = _scalar(values[index])
    if not isinstance(value, int):
        raise ValueError(
            f"{_position(name, index)} = {value} is not a whole number: "
            f"token ids are integers in [0, {vocabulary_size}). Pass the "
            "tokenizer's ids as an int array, not values computed in "
            "floating point."
        )
    raise ValueError(
        f"{_position(name, index)} = {value} is outside "
        f"[0, {vocabulary_size}): {fix}"
    )


def check_padding_mask(name, mask):
    """Raises a ValueError naming the first entry of a padding mask that
    is not 0 or 1 (1 = real token). Symbolic tensors pass."""
    values = host_values(mask)
    if values is None:
        return
    if values.dtype == bool:
        return
    if not (
        np.issubdtype(values.dtype, np.integer)
        or np.issubdtype(values.dtype, np.floating)
    ):
        raise ValueError(
            f"{name} has dtype {values.dtype}; a padding mask holds 1 for "
            "a real token and 0 for padding."
        )
    index = _first_true((values != 0) & (values != 1))
    if index is None:
        return
    raise ValueError(
        f"{_position(name, index)} = {_scalar(values[index])} is not 0 or "
        "1: a padding mask is 1 for a real token and 0 for padding; pass "
        "e.g. (token_ids != pad_id) as int32."
    )
