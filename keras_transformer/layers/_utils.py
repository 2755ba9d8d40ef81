import keras


def clone_initializer(initializer):
    """A fresh copy of an initializer, one per sublayer.

    Sharing one seeded initializer object between sublayers gives them
    identical weights; copying it from its config keeps the user's choice
    without that trap.
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())


def check_rate(name, value):
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name}={value} must be a dropout rate in [0, 1).")
    return float(value)


def check_positive(name, value):
    if int(value) != value or int(value) < 1:
        raise ValueError(f"{name}={value} must be a positive integer.")
    return int(value)
