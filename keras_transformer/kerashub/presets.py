"""A `Translator` written in KerasHub's preset layout, so that
`keras_hub.models.Seq2SeqLM.from_preset` and
`keras_transformer.Translator.from_pretrained` both load it."""

import os

from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.generation.translator import (
    FORMAT_VERSION,
    METADATA_FILE,
    METADATA_KEY,
    TOKENIZER_DIR,
    quantize_model,
)
from keras_transformer.io_utils import read_json, write_json
from keras_transformer.kerashub.backbone import TransformerBackbone
from keras_transformer.kerashub.preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.kerashub.seq2seq_lm import TransformerSeq2SeqLM
from keras_transformer.kerashub.tokenizer import TransformerTokenizer
from keras_transformer.version import __version__


def save_translator(translator, directory):
    """Writes ``translator`` to ``directory`` as a KerasHub preset of a
    `TransformerSeq2SeqLM`.

    KerasHub's files: ``config.json`` (the backbone), ``model.weights.h5``,
    ``task.json`` (with the generation settings), ``metadata.json`` and,
    for a `SubwordTokenizer`, ``preprocessor.json``, ``tokenizer.json``
    and ``assets/tokenizer/vocabulary.spm``. A Marian tokenizer (two
    SentencePiece models and a vocabulary) has no KerasHub counterpart: it
    goes to ``tokenizer/`` and the task has no preprocessor. ``metadata.json``
    also records this package's format version, version, quantization and
    tokenizer training settings.
    """
    model, tokenizer = translator.model, translator.tokenizer
    mode = translator.quantization_mode
    backbone = TransformerBackbone.from_config(model.get_config())
    if mode is not None:
        # The same quantized variables as the model's, in the same order.
        quantize_model(backbone, mode)
    backbone.set_weights(model.get_weights())
    preprocessor = None
    if isinstance(tokenizer, SubwordTokenizer):
        length = backbone.max_sequence_length
        # Fixed names (Keras numbers unnamed layers): the same translator
        # saves the same files.
        preprocessor = TransformerSeq2SeqLMPreprocessor(
            TransformerTokenizer(
                proto=tokenizer.proto, name="transformer_tokenizer"
            ),
            encoder_sequence_length=length,
            decoder_sequence_length=length,
            name="transformer_seq2seq_lm_preprocessor",
        )
    task = TransformerSeq2SeqLM(
        backbone,
        preprocessor,
        translator.generation_config,
        name="transformer_seq2seq_lm",
    )
    task.save_to_preset(directory)
    if preprocessor is None:
        tokenizer.save(os.path.join(directory, TOKENIZER_DIR))
    path = os.path.join(directory, METADATA_FILE)
    metadata = read_json(path)
    # Without the time of saving, the same translator saves the same
    # files, and pushing it again uploads nothing.
    metadata.pop("date_saved", None)
    metadata[METADATA_KEY] = {
        "format_version": FORMAT_VERSION,
        "version": __version__,
        "quantization": mode,
        "tokenizer_config": getattr(tokenizer, "config", None),
    }
    write_json(path, metadata, sort_keys=False)
