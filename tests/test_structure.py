"""The package's shape, read from its source: backend code only behind
the seam (`keras_transformer/backends/`), short functions, no import
circles."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
# Subpackages written in `keras` and `keras.ops` alone.
KERAS_ONLY = ("layers", "models", "generation", "training")
BACKEND_MODULES = ("torch", "jax", "jaxlib", "tensorflow")
MAX_FUNCTION_LINES = 80


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path, ast.parse(path.read_text("utf-8"))


def _imported_names(module, path, tree):
    """Every module name an ``import`` statement of ``tree`` names,
    relative imports resolved."""
    package = (
        module if path.name == "__init__.py" else module.rpartition(".")[0]
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[
                    : len(package.split(".")) - node.level + 1
                ]
                base = ".".join(parts + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def forbidden_imports(modules=None):
    """``(file, imported name)`` for each backend import outside the seam
    (TensorFlow is allowed in `data/`) and each private Keras import, in
    ``modules`` (``(name, path, tree)`` triples; the package's own by
    default)."""
    found = []
    for module, path, tree in modules or _modules():
        subpackage = module.split(".")[1] if "." in module else ""
        for name in _imported_names(module, path, tree):
            top = name.split(".")[0]
            if name.startswith("keras.src") or (
                subpackage in KERAS_ONLY and top in BACKEND_MODULES
            ):
                found.append((str(path.relative_to(PACKAGE.parent)), name))
    return found


def function_lengths():
    """``(lines, "file:function")`` for every function of the package:
    the lines of its body, docstring excluded."""
    lengths = []
    for _, path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if (
                isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body = body[1:]
            if body:
                lines = body[-1].end_lineno - body[0].lineno + 1
                name = f"{path.relative_to(PACKAGE.parent)}:{node.name}"
                lengths.append((lines, name))
    return sorted(lengths, reverse=True)


def import_circles():
    """The groups of package modules that import each other in a
    circle (strongly connected components of the import graph)."""
    modules = {module: (path, tree) for module, path, tree in _modules()}
    graph = {
        module: {
            name
            for name in _imported_names(module, path, tree)
            if name in modules
            and name != module
            and modules[name][0].name != "__init__.py"
        }
        for module, (path, tree) in modules.items()
    }
    circles = []
    for module in graph:
        reachable = _reach(graph, module)
        if module in reachable:
            circle = sorted(m for m in reachable if module in _reach(graph, m))
            if circle not in circles:
                circles.append(circle)
    return circles


def _reach(graph, start):
    """The modules ``start`` imports, directly or through others."""
    seen, pending = set(), list(graph[start])
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(graph[name])
    return seen


def test_backend_code_lives_behind_the_seam():
    assert forbidden_imports() == []


def test_the_import_check_finds_a_planted_backend_import():
    """The check above can fail: a module of `layers/` that imports torch
    or jax, or any module that imports private Keras, is found; the seam
    and `data/` may import backends."""
    source = "import torch\nfrom jax import numpy\nimport tensorflow\n"
    planted = [
        (f"keras_transformer.{sub}.planted", PACKAGE / sub / "planted.py")
        for sub in ("layers", "backends", "data")
    ]
    private = "from keras.src.backend.jax import trainer\n"
    planted.append(("keras_transformer.cli", PACKAGE / "cli.py"))
    modules = [
        (name, path, ast.parse(private if name.endswith("cli") else source))
        for name, path in planted
    ]
    found = forbidden_imports(modules)
    assert found == [
        ("keras_transformer/layers/planted.py", "torch"),
        ("keras_transformer/layers/planted.py", "jax"),
        ("keras_transformer/layers/planted.py", "jax.numpy"),
        ("keras_transformer/layers/planted.py", "tensorflow"),
        ("keras_transformer/cli.py", "keras.src.backend.jax"),
        ("keras_transformer/cli.py", "keras.src.backend.jax.trainer"),
    ]


def test_functions_fit_on_a_screen():
    longest = function_lengths()[:3]
    assert longest[0][0] <= MAX_FUNCTION_LINES, longest


def test_no_import_circles():
    assert import_circles() == []


@pytest.mark.parametrize("name", ["torch_decoder", "fused_adam"])
def test_fast_paths_switch_off_by_name(name, monkeypatch):
    from keras_transformer import backends

    monkeypatch.delenv(backends.ENVIRONMENT_VARIABLE, raising=False)
    with backends.disabled(name):
        assert not backends.enabled(name)
    with backends.disabled():
        assert not any(backends.enabled(n) for n in backends.FAST_PATHS)
    monkeypatch.setenv(
        backends.ENVIRONMENT_VARIABLE, f"tensorflow_filler_row,{name}"
    )
    assert not backends.enabled(name)
    with pytest.raises(ValueError, match="no_such_path"):
        backends.disabled("no_such_path").__enter__()
