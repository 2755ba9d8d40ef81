"""The package's SentencePiece tokenizer as a KerasHub tokenizer."""

import keras
import keras_hub

from keras_transformer.kerashub.backbone import TransformerBackbone

# The pieces of the reserved ids 0 to 3 (pad, unk, start, end) of
# `keras_transformer.data.train_tokenizer`'s models, and of Marian's.
PAD_PIECE = "<pad>"
START_PIECE = "<s>"
END_PIECE = "</s>"


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerTokenizer(keras_hub.tokenizers.SentencePieceTokenizer):
    """`keras_hub.tokenizers.SentencePieceTokenizer` over the model file
    of a `keras_transformer.data.SubwordTokenizer` (one vocabulary shared
    by source and target, section 3.4), with its start, end and pad
    pieces as KerasHub's special tokens.

    Args:
        proto: the SentencePiece model: bytes, or a path to the file.
    """

    backbone_cls = TransformerBackbone

    def __init__(self, proto=None, **kwargs):
        self._add_special_token(START_PIECE, "start_token")
        self._add_special_token(END_PIECE, "end_token")
        self._add_special_token(PAD_PIECE, "pad_token")
        super().__init__(proto=proto, **kwargs)

    @classmethod
    def from_subword_tokenizer(cls, tokenizer):
        """The KerasHub tokenizer of a `SubwordTokenizer` (same model
        file, same ids)."""
        return cls(proto=tokenizer.proto)

    def to_subword_tokenizer(self):
        """The package's `SubwordTokenizer` of the same model file."""
        from keras_transformer.data.tokenizer import SubwordTokenizer

        return SubwordTokenizer(self.proto)
