"""Small helpers shared across the package: initializers, setting checks."""

import dataclasses

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


def replace_settings(settings, overrides, what, error=ValueError):
    """``dataclasses.replace(settings, **overrides)``, raising ``error``
    that names the unknown keys and the known ones instead of a bare
    TypeError from the constructor."""
    fields = sorted(f.name for f in dataclasses.fields(settings))
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise error(f"Unknown {what} {unknown}; the settings are {fields}.")
    return dataclasses.replace(settings, **overrides)
