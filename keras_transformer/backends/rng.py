"""The global random state that resumable training saves.

On torch, Keras's unseeded dropout draws from torch's global random
generator, whose state is in no Keras variable; resuming a run exactly
needs it saved and restored. TensorFlow and JAX keep all of it in the
layers' seed-generator variables.
"""

import base64

import keras
import numpy as np


def global_rng_state():
    """The torch global generator's state as a JSON-ready str; None on
    the other backends."""
    if keras.backend.backend() != "torch":
        return None
    import torch

    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def set_global_rng_state(state):
    """Restores a state from `global_rng_state` (None does nothing)."""
    if state is None or keras.backend.backend() != "torch":
        return
    import torch

    raw = np.frombuffer(base64.b64decode(state), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
