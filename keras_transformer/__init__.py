"""keras-transformer: the Transformer of "Attention Is All You Need" for
Keras 3, on TensorFlow, JAX and PyTorch."""

import importlib

from keras_transformer import _keras_registration
from keras_transformer.version import __version__

# Every submodule and public name loads on first use (PEP 562), so that
# `import keras_transformer` imports no Keras or backend until a model,
# layer or translator is asked for: `keras-transformer --help` and
# `--version` stay fast, and TensorFlow stays out of JAX and torch runs.
_LAZY_SUBMODULES = (
    "layers",
    "models",
    "data",
    "generation",
    "training",
    "hub",
    "plotting",
    "distribute",
    "marian",
)

# Public names and the submodules they live in.
_LAZY_NAMES = {
    "Transformer": "models",
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


# `keras.saving.load_model` needs the layers and models registered: they
# are imported as soon as Keras is.
_keras_registration.install()


def __dir__():
    return sorted({*globals(), *_LAZY_SUBMODULES, *_LAZY_NAMES})


__all__ = [
    "Transformer",
    "Translator",
    "layers",
    "models",
    "plot_attention",
    "plot_training",
    "__version__",
]
