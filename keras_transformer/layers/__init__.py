"""The layers of "Attention Is All You Need" (Vaswani et al., 2017)."""

from keras_transformer.layers.decoder_layer import TransformerDecoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.encoder_layer import TransformerEncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.output_bias import OutputBias
from keras_transformer.layers.position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_transformer.layers.token_embedding import TokenEmbedding

__all__ = [
    "Dropout",
    "MultiHeadAttention",
    "OutputBias",
    "PositionwiseFeedForward",
    "SinusoidalPositionEncoding",
    "TokenEmbedding",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
]
