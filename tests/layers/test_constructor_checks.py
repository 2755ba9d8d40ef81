"""Layer constructors name a bad argument with its value and type."""

import re

import pytest

from keras_transformer import layers

CASES = [
    (layers.TokenEmbedding, dict(vocabulary_size="9", hidden_dim=8),
     "vocabulary_size='9' (a str) must be a positive integer"),
    (layers.TokenEmbedding, dict(vocabulary_size=9, hidden_dim=8, scale="no"),
     "scale='no' (a str) must be True or False"),
    (layers.MultiHeadAttention, dict(num_heads=0),
     "num_heads=0 (an int) must be a positive integer"),
    (layers.MultiHeadAttention, dict(num_heads=2, use_bias="False"),
     "use_bias='False' (a str) must be True or False"),
    (layers.MultiHeadAttention, dict(num_heads=2, dropout=-0.1),
     "dropout=-0.1 (a float) must be a dropout rate"),
    (layers.TransformerEncoderLayer,
     dict(num_heads=2, intermediate_dim=8, normalize_first="True"),
     "normalize_first='True' (a str) must be True or False"),
    (layers.TransformerDecoderLayer,
     dict(num_heads=2, intermediate_dim=8, layer_norm_epsilon="1e-5"),
     "layer_norm_epsilon='1e-5' (a str) must be a positive, finite number"),
    (layers.TransformerDecoderLayer,
     dict(num_heads=2, intermediate_dim=8.5),
     "intermediate_dim=8.5 (a float) must be a positive integer"),
    (layers.SinusoidalPositionEncoding, dict(max_sequence_length="64"),
     "max_sequence_length='64' (a str) must be a positive integer"),
    (layers.SinusoidalPositionEncoding,
     dict(max_sequence_length=64, layout=None),
     "layout=None is not one of ('interleaved', 'concatenated')"),
    (layers.SinusoidalPositionEncoding,
     dict(max_sequence_length=64, max_wavelength=0),
     "max_wavelength=0 (an int) must be a positive, finite number"),
]  # fmt: skip


@pytest.mark.parametrize(
    "layer_class, kwargs, message", CASES, ids=lambda x: str(x)[:40]
)
def test_bad_argument_is_named_with_value_and_type(
    layer_class, kwargs, message
):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        layer_class(**kwargs)


def test_integral_floats_and_numpy_values_are_accepted():
    import numpy as np

    layer = layers.TransformerEncoderLayer(
        num_heads=np.int64(2),
        intermediate_dim=8.0,
        normalize_first=np.bool_(True),
        layer_norm_epsilon=np.float32(1e-6),
    )
    assert (layer.num_heads, layer.intermediate_dim) == (2, 8)
    assert type(layer.num_heads) is int and layer.normalize_first is True
    assert layer.layer_norm_epsilon == pytest.approx(1e-6)
