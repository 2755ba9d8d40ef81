"""Registers the package's layers and models with Keras as soon as Keras
is imported, while `import keras_transformer` itself imports no Keras.

`keras.saving.load_model` finds a saved ``.keras`` file's classes among
those registered with `keras.saving.register_keras_serializable`, which
happens when `keras_transformer.layers` and `keras_transformer.models`
run. The package loads them on first use (PEP 562), so a process that
imports `keras_transformer` and Keras and then loads a saved model would
not find them. `install` puts a finder first on `sys.meta_path` that
watches the imports of ``keras`` and of this package's submodules: once
Keras is imported and no submodule is half way through its own import
(importing another one from inside it could find it half initialized),
it imports the registering submodules and removes itself.
"""

import importlib
import importlib.abc
import importlib.util
import sys

REGISTERING_SUBMODULES = (
    "keras_transformer.layers",
    "keras_transformer.models",
)


class _RegisterAfterKeras(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the watched modules with the other finders and runs them
    through `exec_module`, which counts how deep the imports are."""

    def __init__(self):
        self.loaders = {}
        self.depth = 0

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras" and not fullname.startswith(
            "keras_transformer."
        ):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        self.loaders[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        loader = self.loaders.pop(module.__name__)
        module.__spec__.loader = module.__loader__ = loader
        self.depth += 1
        try:
            loader.exec_module(module)
        finally:
            self.depth -= 1
        if self.depth == 0 and "keras" in sys.modules:
            self.register()

    def register(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in REGISTERING_SUBMODULES:
            importlib.import_module(name)


def install():
    """Registers now if Keras is already imported, else on its import."""
    finder = _RegisterAfterKeras()
    if "keras" in sys.modules:
        finder.register()
    else:
        sys.meta_path.insert(0, finder)
