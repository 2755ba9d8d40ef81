"""The Transformer on KerasHub's public API: a `Backbone`, a tokenizer,
a `Seq2SeqLMPreprocessor` and a `Seq2SeqLM` task, registered so that
`keras_hub.models.Seq2SeqLM.from_preset` returns this package's task for
its presets."""

from keras_transformer.kerashub.backbone import TransformerBackbone
from keras_transformer.kerashub.preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.kerashub.seq2seq_lm import TransformerSeq2SeqLM
from keras_transformer.kerashub.tokenizer import TransformerTokenizer

__all__ = [
    "TransformerBackbone",
    "TransformerSeq2SeqLM",
    "TransformerSeq2SeqLMPreprocessor",
    "TransformerTokenizer",
]
