"""The one seam for backend-specific code.

The layers, the model, the searches and the training code are written in
`keras` and `keras.ops` alone and run unchanged on TensorFlow, JAX and
torch. What a backend does better with its own kernels lives here, as a
*fast path*: registered once by name in `FAST_PATHS`, chosen once where a
model, a loss, an optimizer or a search is built or compiled, and
switchable off by name. With every fast path off, the package runs
Keras's own code on every backend and gives the same results (to float
rounding): the suite passes that way too.

Switch fast paths off with the environment variable
``KERAS_TRANSFORMER_DISABLE_FAST_PATHS`` (comma-separated names, or
``all``), read when a path is chosen, or in code:

>>> from keras_transformer import backends
>>> with backends.disabled("torch_decoder"):
...     translator = Translator.from_pretrained(...)  # plain Keras decoding

Besides the fast paths, this package holds the few places where backends
must differ to work at all: how a search loop is compiled
(`compile_search`) and the torch global random state that resumable
training saves (`global_rng_state`).
"""

import contextlib
import dataclasses
import functools
import os
import threading
import typing

import keras

ENVIRONMENT_VARIABLE = "KERAS_TRANSFORMER_DISABLE_FAST_PATHS"


@dataclasses.dataclass(frozen=True)
class FastPath:
    """A registered fast path.

    Attributes:
        name: what `enabled` and `disabled` take.
        backends: the Keras backends it serves.
        summary: what it replaces, in one line.
        available: None, or a function saying whether it gives the
            results of the code it replaces on this machine (asked once
            it is needed, on one of ``backends``).
    """

    name: str
    backends: tuple
    summary: str
    available: typing.Callable[[], bool] | None = None

    def runs_here(self):
        """Whether it serves the current Keras backend and gives the
        results of the code it replaces on this machine."""
        return keras.backend.backend() in self.backends and (
            self.available is None or self.available()
        )


def _onednn_int8_is_exact():
    from keras_transformer.backends import torch_decoding

    return torch_decoding.onednn_int8_is_exact()


FAST_PATHS = {
    path.name: path
    for path in (
        FastPath(
            "torch_decoder",
            ("torch",),
            "a cached search's encoder and decoder step as torch kernels "
            "(backends/torch_decoding.py) instead of Keras layer calls",
        ),
        FastPath(
            "onednn_matmul",
            ("torch",),
            "the matrix products of the torch_decoder step by oneDNN's "
            "linear kernel (torch.ops.mkldnn._linear_pointwise) instead of "
            "torch.addmm's BLAS",
        ),
        FastPath(
            "onednn_int8",
            ("torch",),
            "the int8 products of a quantized model's torch_decoder step "
            "by oneDNN's int8 linear kernel (torch.ops.onednn."
            "qlinear_pointwise) on Keras's int8 weights, instead of Keras's "
            "int8 layer calls; only where that kernel's integer products "
            "are exact (CPUs with VNNI instructions)",
            available=_onednn_int8_is_exact,
        ),
        FastPath(
            "fused_adam",
            ("tensorflow", "torch"),
            "Adam's update as one fused kernel: ResourceApplyAdam on "
            "TensorFlow's graph executor, torch._fused_adam_ on the CPU "
            "(backends/adam.py)",
        ),
        FastPath(
            "fused_loss",
            ("tensorflow",),
            "label-smoothed cross-entropy by the backend's fused kernel "
            "(backends/losses.py)",
        ),
        FastPath(
            "jax_train_options",
            ("jax",),
            "the training step compiled with XLA's region-analysis copy "
            "insertion on the CPU (backends/jax_training.py), which drops "
            "a copy of every variable per step",
        ),
        FastPath(
            "tensorflow_filler_row",
            ("tensorflow",),
            "a lone cached one-hypothesis source searched beside a filler "
            "row on TensorFlow's XLA for the CPU",
        ),
    )
}

_state = threading.local()


def _disabled_names():
    names = set(getattr(_state, "disabled", ()))
    setting = os.environ.get(ENVIRONMENT_VARIABLE, "")
    names.update(n.strip() for n in setting.split(",") if n.strip())
    return names


def enabled(name):
    """Whether fast path ``name`` applies: it serves the current Keras
    backend, is not switched off, and gives the results of the code it
    replaces on this machine."""
    path = _check_name(name)
    if path is None:
        raise ValueError("enabled() takes one fast path's name, not 'all'.")
    disabled_names = _disabled_names()
    if "all" in disabled_names or name in disabled_names:
        return False
    return path.runs_here()


@contextlib.contextmanager
def disabled(*names):
    """Within the block (in this thread), the fast paths ``names`` (all of
    them when none is given) are off where a model, loss, optimizer or
    search is built or compiled."""
    for name in names:
        _check_name(name)
    previous = getattr(_state, "disabled", frozenset())
    _state.disabled = previous | (set(names) or {"all"})
    try:
        yield
    finally:
        _state.disabled = previous


def _check_name(name):
    if name == "all":
        return None
    if name not in FAST_PATHS:
        raise ValueError(
            f"Unknown fast path {name!r}; the fast paths are "
            f"{sorted(FAST_PATHS)}."
        )
    return FAST_PATHS[name]


def jax_device_kind():
    """``"cpu"``, ``"gpu"`` or ``"tpu"`` on JAX (its first device), else
    None."""
    if keras.backend.backend() != "jax":
        return None
    return _first_jax_device()


@functools.cache
def _first_jax_device():
    # "cpu:0" -> "cpu"
    return keras.distribution.list_devices()[0].split(":")[0]


def broadcast_attention_masks():
    """Whether attention masks should be broadcast over the queries
    before `keras.ops.dot_product_attention`.

    On a JAX GPU, Keras tries cuDNN's fused attention first. cuDNN takes
    only a mask as long as the queries: it refuses one that broadcasts
    over them (a padding mask), and Keras logs each refusal as an error
    before falling back to XLA. Elsewhere masks stay as they are.
    """
    return jax_device_kind() == "gpu"


def cached_decoder(model, cache_layout):
    """``fn(token_ids, cache, index, encoder_padding_mask)``, the
    ``torch_decoder`` fast path for ``model``'s cached decoding step with
    a ``"stacked"`` or ``"split"`` cache, where it applies (torch, a
    model whose decoder it computes), its products by oneDNN with the
    ``onednn_matmul`` fast path, and a model quantized to int8 computed
    with the ``onednn_int8`` one; else None, and the search calls
    `Transformer.decode`."""
    if cache_layout not in ("stacked", "split") or not enabled("torch_decoder"):
        return None
    from keras_transformer.backends import torch_decoding

    return torch_decoding.cached_decoder(
        model,
        onednn=enabled("onednn_matmul"),
        int8=enabled("onednn_int8"),
    )


def default_cache_layout():
    """The decoder cache layout a search uses by default: ``"split"``, one
    keys tensor and one values tensor per layer, heads first. XLA reads
    and updates those in place, while it copies slices of a stacked
    cache; the ``torch_decoder`` fast path writes either in place, and a
    beam search's reordering of the cache rows each step allocates one
    buffer per tensor, where smaller buffers come back from the
    allocator's free lists instead of fresh pages."""
    return "split"


def fused_adam():
    """The module of the ``fused_adam`` fast path where it applies, else
    None."""
    if not enabled("fused_adam"):
        return None
    from keras_transformer.backends import adam

    return adam


def make_train_function(model):
    """Builds ``model``'s compiled training step with the
    ``jax_train_options`` fast path where it applies and returns True;
    else False, and Keras's `make_train_function` is to run."""
    if not enabled("jax_train_options"):
        return False
    from keras_transformer.backends import jax_training

    return jax_training.make_train_function(model)


def smoothed_cross_entropy_function():
    """``fn(labels, logits, eps)`` of the ``fused_loss`` fast path where
    it applies, else None."""
    if not enabled("fused_loss"):
        return None
    from keras_transformer.backends import losses

    return losses.smoothed_cross_entropy


from keras_transformer.backends.compile import (  # noqa: E402
    compile_search,
    search_rows,
)
from keras_transformer.backends.rng import (  # noqa: E402
    global_rng_state,
    set_global_rng_state,
)

__all__ = [
    "FAST_PATHS",
    "FastPath",
    "broadcast_attention_masks",
    "cached_decoder",
    "compile_search",
    "default_cache_layout",
    "disabled",
    "enabled",
    "fused_adam",
    "global_rng_state",
    "make_train_function",
    "search_rows",
    "set_global_rng_state",
    "smoothed_cross_entropy_function",
]
