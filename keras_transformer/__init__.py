"""keras-transformer: the Transformer of "Attention Is All You Need" for
Keras 3, on TensorFlow, JAX and PyTorch."""

import importlib

from keras_transformer import layers, models
from keras_transformer.models import Transformer
from keras_transformer.version import __version__

# Submodules that import TensorFlow or other heavy dependencies load on
# first use, so that `import keras_transformer` stays light on JAX and torch.
_LAZY_SUBMODULES = (
    "data",
    "generation",
    "training",
    "hub",
    "plotting",
    "distribute",
    "marian",
)


# Public names that live in lazily loaded submodules.
_LAZY_NAMES = {
    "Translator": "generation",
    "plot_attention": "plotting",
    "plot_training": "plotting",
}


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"keras_transformer.{name}")
    if name in _LAZY_NAMES:
        module = importlib.import_module(
            f"keras_transformer.{_LAZY_NAMES[name]}"
        )
        return getattr(module, name)
    raise AttributeError(
        f"module 'keras_transformer' has no attribute {name!r}"
    )


__all__ = [
    "Transformer",
    "Translator",
    "layers",
    "models",
    "plot_attention",
    "plot_training",
    "__version__",
]
