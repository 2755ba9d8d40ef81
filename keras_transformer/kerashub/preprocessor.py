"""Raw text to the Transformer's inputs, as a KerasHub preprocessor."""

import keras
import keras_hub

from keras_transformer.kerashub.backbone import (
    TransformerBackbone,
    check_preset_architecture,
    resolve_preset,
)
from keras_transformer.kerashub.tokenizer import TransformerTokenizer


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLMPreprocessor(keras_hub.models.Seq2SeqLMPreprocessor):
    """Turns ``{"encoder_text": ..., "decoder_text": ...}`` string pairs
    into the four inputs of `TransformerBackbone`, the labels and their
    weights, the way `keras_transformer.data.translation_dataset` does for
    files: the source is its pieces and the end token, the decoder reads
    the start token and the target, and the labels are the target and
    the end token (section 3: the decoder predicts the next token); pad
    positions weigh 0.

    Args:
        tokenizer: a `TransformerTokenizer`.
        encoder_sequence_length: source tokens per row (longer sources
            are cut, keeping the end token's place).
        decoder_sequence_length: target tokens per row.
    """

    backbone_cls = TransformerBackbone
    tokenizer_cls = TransformerTokenizer

    def __init__(
        self,
        tokenizer,
        encoder_sequence_length=128,
        decoder_sequence_length=128,
        **kwargs,
    ):
        super().__init__(
            tokenizer=tokenizer,
            encoder_sequence_length=encoder_sequence_length,
            decoder_sequence_length=decoder_sequence_length,
            **kwargs,
        )

    def get_config(self):
        # KerasHub's base class does not save the sequence lengths: a
        # preset would load with its defaults.
        config = super().get_config()
        config["encoder_sequence_length"] = self.encoder_sequence_length
        config["decoder_sequence_length"] = self.decoder_sequence_length
        return config

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """`keras_hub.models.Seq2SeqLMPreprocessor.from_preset`, refusing
        in one line a preset of another architecture."""
        # The architecture first, naming the preset as given and reading
        # only its config.json; then a pinned Hub reference becomes its
        # snapshot directory.
        check_preset_architecture(
            preset, cls, "keras_hub.models.Seq2SeqLMPreprocessor"
        )
        preset = resolve_preset(preset)
        return super().from_preset(preset, **kwargs)

    def build(self, input_shape):
        super().build(input_shape)
        # The encoder reads no start token (section 3.1's input is the
        # source sentence): only the end token is added.
        self.encoder_packer = keras_hub.layers.StartEndPacker(
            start_value=None,
            end_value=self.tokenizer.end_token_id,
            pad_value=self.tokenizer.pad_token_id,
            sequence_length=self.encoder_sequence_length,
            return_padding_mask=True,
        )
