"""Code run around the import of chosen modules (a `sys.meta_path`
finder), for the package's lazy loading and the command's quiet start.
"""

import importlib.abc
import importlib.util
import sys


class ImportHook(importlib.abc.MetaPathFinder):
    """Imports each module whose name ``watch`` accepts inside the
    context manager ``around(name)``; the modules are found and loaded
    by the other finders and loaders as usual.

    Installed first on `sys.meta_path` by `install`, until `remove`.
    """

    def __init__(self, watch, around):
        self.watch = watch
        self.around = around

    def install(self):
        sys.meta_path.insert(0, self)

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname, path, target=None):
        if not self.watch(fullname):
            return None
        # The other finders' answer; also asked by code that only checks
        # that a module is there (importlib.util.find_spec).
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Around(spec.loader, self.around)
        return spec


class _Around(importlib.abc.Loader):
    """``loader`` with its `exec_module` run inside ``around(name)``;
    everything else (``get_code`` for ``python -m``, resource readers)
    is the loader's own."""

    def __init__(self, loader, around):
        self.loader = loader
        self.around = around

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader (reload, resources).
        module.__spec__.loader = module.__loader__ = self.loader
        with self.around(module.__name__):
            self.loader.exec_module(module)
