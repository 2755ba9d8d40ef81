"""The functional Transformer model and its named configurations."""

from keras_transformer.models.configs import CONFIGS
from keras_transformer.models.transformer import Transformer

__all__ = ["CONFIGS", "Transformer"]
