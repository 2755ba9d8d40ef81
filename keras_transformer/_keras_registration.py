"""Registers the package's layers and models with Keras as soon as Keras
is imported, while `import keras_transformer` itself imports no Keras.

`keras.saving.load_model` finds a saved ``.keras`` file's classes among
those registered with `keras.saving.register_keras_serializable`, which
happens when `keras_transformer.layers` and `keras_transformer.models`
run. The package loads them on first use (PEP 562), so a process that
imports `keras_transformer` and Keras and then loads a saved model would
not find them. `install` watches the imports of ``keras`` and of this
package's submodules: once Keras is imported and no submodule is half
way through its own import (importing another one from inside it could
find it half initialized), it imports the registering submodules and
stops watching.
"""

import contextlib
import importlib
import sys

from keras_transformer._import_hooks import ImportHook

REGISTERING_SUBMODULES = (
    "keras_transformer.layers",
    "keras_transformer.models",
)


class _Registration:
    def __init__(self):
        self.depth = 0
        self.hook = ImportHook(self.watch, self.counted)

    @staticmethod
    def watch(name):
        return name == "keras" or name.startswith("keras_transformer.")

    @contextlib.contextmanager
    def counted(self, name):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.depth == 0 and "keras" in sys.modules:
            self.register()

    def register(self):
        self.hook.remove()
        for name in REGISTERING_SUBMODULES:
            importlib.import_module(name)


class _KerasHubRegistration:
    """KerasHub's `from_preset` finds this package's task, backbone,
    preprocessor and tokenizer among the registered classes: they are
    imported (`keras_transformer.kerashub`) as soon as `keras_hub` is."""

    def __init__(self):
        self.hook = ImportHook(lambda name: name == "keras_hub", self.after)

    @contextlib.contextmanager
    def after(self, name):
        yield
        self.register()

    def register(self):
        self.hook.remove()
        importlib.import_module("keras_transformer.kerashub")


def install():
    """Registers now if Keras (KerasHub) is already imported, else once
    it is."""
    registration = _Registration()
    if "keras" in sys.modules:
        registration.register()
    else:
        registration.hook.install()
    kerashub = _KerasHubRegistration()
    if "keras_hub" in sys.modules:
        kerashub.register()
    else:
        kerashub.hook.install()
