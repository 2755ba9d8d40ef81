"""A translator's model, tokenizer and generation settings written in
KerasHub's preset layout, so that `keras_hub.models.Seq2SeqLM.from_preset`
and `keras_transformer.Translator.from_pretrained` both load them."""

import os

from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.generation.quantization import (
    quantization_mode,
    quantize_model,
    quantized_embeddings,
)
from keras_transformer.io_utils import read_json, write_json
from keras_transformer.kerashub.backbone import TransformerBackbone
from keras_transformer.kerashub.preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.kerashub.tokenizer import TransformerTokenizer

# KerasHub's file names.
CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor.json"
TASK_FILE = "task.json"
METADATA_FILE = "metadata.json"
# The task that `keras_hub.models.Seq2SeqLM.from_preset` builds.
TASK = {
    "module": "keras_transformer.kerashub.seq2seq_lm",
    "class_name": "TransformerSeq2SeqLM",
    "registered_name": "keras_transformer>TransformerSeq2SeqLM",
}


def save_preset(model, tokenizer, generation_config, directory, metadata):
    """Writes a `TransformerSeq2SeqLM` preset of ``model`` (a `Transformer`)
    into ``directory``; returns whether the tokenizer went into it.

    The backbone and the preprocessor are saved by KerasHub
    (``config.json``, ``model.weights.h5``, ``metadata.json``;
    ``preprocessor.json``, ``tokenizer.json``,
    ``assets/tokenizer/vocabulary.spm``) and ``task.json`` is the task's
    config around them, with ``generation_config`` (a dict of the
    `GenerationConfig`), as the task's ``save_to_preset`` writes it. A
    tokenizer that is not a `SubwordTokenizer` (Marian's two SentencePiece
    models) has no KerasHub counterpart: the task then has no
    preprocessor and the caller saves the tokenizer. ``metadata`` is
    added to ``metadata.json``.
    """
    backbone = TransformerBackbone.from_config(model.get_config())
    mode = quantization_mode(model)
    if mode is not None:
        # The same quantized variables as the model's, in the same order.
        quantize_model(backbone, mode, quantized_embeddings(model))
    backbone.set_weights(model.get_weights())
    backbone.save_to_preset(directory)
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
        preprocessor.save_to_preset(directory)
    _write_task(directory, generation_config, preprocessor is not None)
    _add_metadata(directory, metadata)
    return preprocessor is not None


def _write_task(directory, generation_config, with_preprocessor):
    config = {
        "backbone": read_json(os.path.join(directory, CONFIG_FILE)),
        "preprocessor": (
            read_json(os.path.join(directory, PREPROCESSOR_FILE))
            if with_preprocessor
            else None
        ),
        "name": "transformer_seq2seq_lm",
        "generation_config": generation_config,
    }
    write_json(
        os.path.join(directory, TASK_FILE),
        {**TASK, "config": config},
        indent=4,
        sort_keys=False,
    )


def _add_metadata(directory, metadata):
    path = os.path.join(directory, METADATA_FILE)
    saved = read_json(path)
    # Without the time of saving, the same translator saves the same
    # files, and pushing it again uploads nothing. The task list is the
    # task of this backbone, whether or not its module was imported.
    saved.pop("date_saved", None)
    saved["tasks"] = ["Seq2SeqLM"]
    write_json(path, {**saved, **metadata}, indent=4, sort_keys=False)
