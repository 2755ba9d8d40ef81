"""Weight quantization of a translator's model (Keras's
`Model.quantize`)."""

import gc
import warnings

# The weight quantizations `Translator.quantize` applies, saves and loads.
QUANTIZATION_MODES = ("int8",)


def quantization_mode(model):
    """The quantization of a model's weights: None when no layer is
    quantized, else the mode (``"int8"``; several joined by ``"+"``)."""
    # Keras's own `Model.quantize` walks the layers the same way.
    modes = {layer.quantization_mode for layer in model._flatten_layers()}
    modes.discard(None)
    return "+".join(sorted(modes)) or None


def check_quantization_mode(mode, message=None):
    """Raises a `ValueError` for a mode not in `QUANTIZATION_MODES`."""
    if mode not in QUANTIZATION_MODES:
        raise ValueError(
            message
            or f"mode={mode!r} is not a supported quantization; use one of "
            f"{QUANTIZATION_MODES}."
        )


def quantize_model(model, mode, embeddings=True):
    """Keras's `Model.quantize`, without its warning for each layer that
    has no quantized form (norms, dropout, positions); the token
    embeddings too unless ``embeddings`` is false (the layout of
    translators saved before they were quantized)."""
    # Keras runs a full garbage collection as it drops each float kernel:
    # seconds apiece in a process holding a framework's objects. Frozen,
    # those objects are left out of these collections (they are
    # collected as usual once unfrozen).
    gc.freeze()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore",
                message=r"Layer \w+ does not have a `quantize` method",
            )
            model.quantize(
                mode, filters=None if embeddings else _not_an_embedding
            )
    finally:
        gc.unfreeze()


def quantized_embeddings(model):
    """Whether ``model``'s token embeddings are quantized (translators
    quantized before `TokenEmbedding` had an int8 form hold them in
    float32)."""
    return any(
        not _not_an_embedding(layer) and layer.quantization_mode is not None
        for layer in model._flatten_layers()
    )


def _not_an_embedding(layer):
    from keras_transformer.layers import TokenEmbedding

    return not isinstance(layer, TokenEmbedding)
