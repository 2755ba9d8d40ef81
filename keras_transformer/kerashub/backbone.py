"""The Transformer as a KerasHub `Backbone`."""

import json
import os

import keras
import keras_hub

from keras_transformer import hub
from keras_transformer.models.transformer import Transformer


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerBackbone(Transformer, keras_hub.models.Backbone):
    """`keras_transformer.Transformer` as a `keras_hub.models.Backbone`.

    The backbone is the functional Transformer itself (same arguments,
    same layers, same weights, logits out), so everything that takes a
    `Transformer` (the searches, `Translator`, the recipes) takes it too,
    and KerasHub's preset machinery (`save_to_preset`, `from_preset`,
    `keras_hub.upload_preset`) saves and loads it.

    Example:
    >>> backbone = TransformerBackbone.from_config_name(
    ...     "base", vocabulary_size=8000)
    >>> backbone.save_to_preset("preset")
    >>> keras_hub.models.Backbone.from_preset("preset")
    """

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """`keras_hub.models.Backbone.from_preset`, refusing in one line a
        preset of another architecture (`check_preset_architecture`)."""
        # The architecture first, naming the preset as given and reading
        # only its config.json; then a pinned Hub reference becomes its
        # snapshot directory.
        check_preset_architecture(preset, cls, "keras_hub.models.Backbone")
        preset = resolve_preset(preset)
        return super().from_preset(preset, load_weights, **kwargs)

    @classmethod
    def from_transformer(cls, transformer):
        """A backbone with ``transformer``'s configuration and a copy of
        its weights."""
        backbone = cls.from_config(transformer.get_config())
        backbone.set_weights(transformer.get_weights())
        return backbone


def resolve_preset(preset):
    """A preset handle that KerasHub's loader takes: a Hub reference
    pinned to a revision (``"hf://owner/name@revision"``, which KerasHub
    reads as a repository name) becomes the snapshot directory of that
    revision, verified against its manifest when it has one
    (`keras_transformer.hub.resolve_directory`); other handles are
    returned as they are."""
    if isinstance(preset, str) and preset.startswith("hf://") and "@" in preset:
        return hub.resolve_directory(preset)
    return preset


def check_preset_architecture(preset, cls, loader):
    """Raises a one-line ValueError when ``preset`` is a KerasHub preset of
    another backbone than `TransformerBackbone`, naming both classes and
    ``loader``, the KerasHub class whose ``from_preset`` loads any
    architecture (KerasHub itself only says that it found no subclass).

    Reads the preset's ``config.json`` alone: in a local directory, or
    from the Hub for ``hf://owner/name[@revision]``. A preset whose
    ``config.json`` cannot be read, or that is not a serialized Keras
    object (a Transformers checkpoint), is left to KerasHub's loader.
    """
    config = _preset_config(preset)
    if not isinstance(config, dict) or "registered_name" not in config:
        return
    saved = keras.saving.get_registered_object(config["registered_name"])
    if isinstance(saved, type) and issubclass(saved, TransformerBackbone):
        return
    name = config.get("class_name") or config["registered_name"]
    raise ValueError(
        f"{preset} holds a {name} preset; {cls.__name__} loads "
        f"{TransformerBackbone.__name__} presets (saved by "
        f"keras_transformer). Load it with {loader}.from_preset instead."
    )


def _preset_config(preset):
    """The preset's ``config.json`` as a dict, or None where it cannot be
    read (KerasHub's loader then reports why)."""
    path = None
    if isinstance(preset, (str, os.PathLike)) and os.path.isdir(preset):
        path = os.path.join(preset, "config.json")
    elif isinstance(preset, str) and preset.startswith("hf://"):
        import huggingface_hub

        repo, _, revision = preset.removeprefix("hf://").partition("@")
        try:
            path = huggingface_hub.hf_hub_download(
                repo, "config.json", revision=revision or None
            )
        except (OSError, ValueError):
            # Unreachable, missing or misnamed: KerasHub's loader raises.
            return None
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except ValueError:
        return None
