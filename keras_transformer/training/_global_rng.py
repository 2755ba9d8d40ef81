"""The one backend-specific piece of resumable training.

On the torch backend, Keras' unseeded dropout draws from torch's global
random generator, whose state is in no Keras variable; resuming exactly
needs it saved and restored. TensorFlow and JAX keep all of it in the
layers' seed-generator variables.
"""

import base64

import keras


def get_state():
    """The global generator's state as a JSON-ready str, or None."""
    if keras.backend.backend() != "torch":
        return None
    import torch

    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def set_state(state):
    if state is None or keras.backend.backend() != "torch":
        return
    import numpy as np
    import torch

    raw = np.frombuffer(base64.b64decode(state), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
