import math

import keras
from keras import ops

from keras_transformer.utils import (
    check_positive,
    check_positive_float,
    describe,
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encodings (Vaswani et al., 2017, 3.5).

    ``PE(pos, 2i) = sin(pos / 10000^(2i / d_model))`` and
    ``PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))``: sine on even
    channels and cosine on odd ones (``layout="interleaved"``, the paper's).
    ``layout="concatenated"`` puts all sines in the first half and all
    cosines in the second half, the layout Marian and tensor2tensor use.

    The layer has no weights. It returns the encodings for the positions of
    its input, shape ``(1, sequence_length, hidden_dim)``, to be added to the
    token embeddings.

    Args:
        max_sequence_length: the longest sequence the model accepts. Longer
            inputs raise a `ValueError` instead of silently extrapolating.
        max_wavelength: the base of the geometric progression of
            wavelengths, 10000 in the paper.
        layout: ``"interleaved"`` (the paper) or ``"concatenated"``.

    Call arguments:
        inputs: a tensor of shape ``(batch, sequence_length, hidden_dim)``.
        start_index: position of the first element of ``inputs``; used
            when decoding one step at a time.

    Example:
    >>> layer = SinusoidalPositionEncoding(max_sequence_length=128)
    >>> layer(keras.ops.zeros((2, 10, 64))).shape
    (1, 10, 64)
    """

    LAYOUTS = ("interleaved", "concatenated")

    def __init__(
        self,
        max_sequence_length,
        max_wavelength=10000.0,
        layout="interleaved",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if layout not in self.LAYOUTS:
            raise ValueError(
                f"layout={describe(layout)} is not one of {self.LAYOUTS}."
            )
        self.max_sequence_length = check_positive(
            "max_sequence_length", max_sequence_length
        )
        self.max_wavelength = check_positive_float(
            "max_wavelength", max_wavelength
        )
        self.layout = layout

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if hidden_dim is None or hidden_dim % 2:
            raise ValueError(
                f"hidden_dim={hidden_dim} must be even for sinusoidal "
                "position encodings (one sine and one cosine per frequency). "
                "Use an even hidden_dim."
            )
        self.hidden_dim = hidden_dim
        self.built = True

    def call(self, inputs, start_index=0):
        length = inputs.shape[1]
        if isinstance(length, int) and length > self.max_sequence_length:
            raise ValueError(
                f"{self.name}: a sequence of length {length} is longer than "
                f"max_sequence_length={self.max_sequence_length}. Truncate "
                "the inputs or build the model with a larger "
                "max_sequence_length."
            )
        if length is None:
            length = ops.shape(inputs)[1]
        # Angles are computed in float32 whatever the policy: bfloat16 has
        # too few mantissa bits to tell positions in the hundreds apart.
        positions = ops.cast(ops.arange(length), "float32") + ops.cast(
            start_index, "float32"
        )
        half = self.hidden_dim // 2
        exponents = ops.arange(half, dtype="float32") * (2.0 / self.hidden_dim)
        inverse_wavelengths = ops.exp(
            -math.log(self.max_wavelength) * exponents
        )
        angles = positions[:, None] * inverse_wavelengths[None, :]
        sin, cos = ops.sin(angles), ops.cos(angles)
        if self.layout == "interleaved":
            # (length, half, 2) -> (length, hidden_dim): sin, cos, sin, ...
            encoding = ops.reshape(
                ops.stack([sin, cos], axis=-1), (-1, self.hidden_dim)
            )
        else:
            encoding = ops.concatenate([sin, cos], axis=-1)
        return ops.cast(encoding[None, :, :], self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (1, input_shape[1], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_sequence_length": self.max_sequence_length,
                "max_wavelength": self.max_wavelength,
                "layout": self.layout,
            }
        )
        return config
