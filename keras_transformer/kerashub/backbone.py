"""The Transformer as a KerasHub `Backbone`."""

import keras
import keras_hub

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
    def from_transformer(cls, transformer):
        """A backbone with ``transformer``'s configuration and a copy of
        its weights."""
        backbone = cls.from_config(transformer.get_config())
        backbone.set_weights(transformer.get_weights())
        return backbone
