import keras
from keras import ops

from keras_transformer.utils import check_positive


@keras.saving.register_keras_serializable(package="keras_transformer")
class OutputBias(keras.layers.Layer):
    """A learned bias added to the logits, one value per vocabulary entry.

    The paper's pre-softmax projection shares the embedding matrix and has
    no bias (3.4); Marian / OPUS-MT models add one after it (their
    ``final_logits_bias``). `Transformer(use_output_bias=True)` inserts
    this layer after the tied projection.

    Args:
        vocabulary_size: the size of the last axis of the logits.

    Call arguments:
        inputs: logits ``(..., vocabulary_size)``.

    Example:
    >>> layer = OutputBias(vocabulary_size=100)
    >>> layer(keras.ops.zeros((2, 5, 100))).shape
    (2, 5, 100)
    """

    def __init__(self, vocabulary_size, bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive(
            "vocabulary_size", vocabulary_size
        )
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, input_shape=None):
        self.bias = self.add_weight(
            name="bias",
            shape=(self.vocabulary_size,),
            initializer=self.bias_initializer,
        )
        self.built = True

    def call(self, inputs):
        return inputs + ops.cast(self.bias, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
