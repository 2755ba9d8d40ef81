"""A `Translator` as a TensorFlow SavedModel for serving.

`export_translator(translator, directory)` writes a SavedModel whose
``serving_default`` signature takes a 1-D batch of ``tf.string``
sentences and returns, per sentence, the best translation
(``translations``, ``tf.string``) and its length-normalized score
(``scores``, ``tf.float32``), as `Translator.translate_with_scores` gives
them. Everything runs in the graph: SentencePiece tokenization
(tensorflow-text), the end token, padding, the cached search of
`keras_transformer.generation` with the translator's generation settings
(traced from `Generator.search_function`, not a second implementation),
and detokenization. A consumer needs ``tensorflow`` and
``tensorflow-text`` only:

>>> import tensorflow as tf
>>> import tensorflow_text  # registers the SentencePiece ops
>>> serve = tf.saved_model.load("export/").signatures["serving_default"]
>>> serve(tf.constant(["A man rides a bike."]))["translations"]

The graph is built under the TensorFlow backend; a translator of another
backend is saved to a temporary directory and exported by a subprocess
(``python -m keras_transformer.export SAVED_DIR OUT_DIR``) with
``KERAS_BACKEND=tensorflow``.
"""

import dataclasses
import os
import subprocess
import sys
import tempfile
import traceback
import typing

import keras
import numpy as np

from keras_transformer import marian
from keras_transformer.generation.generator import (
    bucket_batch,
    check_length_settings,
    check_settings,
    search_key,
    search_params,
)
from keras_transformer.io_utils import replace_directory_atomically

SIGNATURE = "serving_default"
# Python's whitespace (`str.isspace`, what `str.strip` removes) as an RE2
# character class: the Unicode separators and the control characters
# Python counts as whitespace.
WHITESPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f\x85\p{Z}]"
# Marian's multilingual models take a leading language code, ">>fra<<".
_LANGUAGE_CODE = r"(?s)^(>>.*?<<).*$"
_LANGUAGE_CODE_PREFIX = r"(?s)^>>.*?<<"
_SPIECE_UNDERLINE = "\u2581"


def export_translator(translator, directory):
    """Writes ``translator`` to ``directory`` as a TensorFlow SavedModel.

    The ``serving_default`` signature maps ``sentences`` (a 1-D
    ``tf.string`` tensor) to ``{"translations": tf.string, "scores":
    tf.float32}``, one of each per sentence: the best hypothesis of the
    translator's search (greedy or beam, its beam size, length penalty
    and length limits) and its score. As in `Translator.translate`, an
    empty or all-whitespace sentence gives ``""`` and score 0, and a
    sentence of more than ``max_sequence_length - 1`` subword tokens is
    truncated (silently: a graph has no warnings). Sentences are decoded
    in chunks of the translator's ``batch_size`` (rounded up to a power
    of two); the source is padded to the model's ``max_sequence_length``.

    The SavedModel is written next to ``directory`` and renamed into
    place, replacing what was there (`Translator.export` refuses a
    non-empty directory without ``overwrite=True``); a failed export
    leaves ``directory`` as it was.

    Args:
        translator: a `keras_transformer.Translator` with a
            `SubwordTokenizer` or a `marian.MarianTokenizer`, and
            ``method="greedy"`` or ``"beam"``.
        directory: where to write the SavedModel.

    Returns:
        The absolute path of the SavedModel directory.
    """
    directory = os.path.abspath(os.fspath(directory))
    _check_exportable(translator)
    if keras.backend.backend() != "tensorflow":
        _export_in_subprocess(translator, directory)
    else:
        replace_directory_atomically(
            directory, lambda staging: _write_saved_model(translator, staging)
        )
    return directory


def _check_exportable(translator):
    """Raises, before any work, for what the SavedModel cannot serve."""
    config = translator.generation_config
    if config.method not in ("greedy", "beam"):
        raise ValueError(
            f"method={config.method!r} cannot be exported: the serving "
            "signature returns one deterministic translation per sentence. "
            'Export a translator with method="greedy" or method="beam".'
        )
    tokenizer = translator.tokenizer
    if not isinstance(tokenizer, marian.MarianTokenizer) and not isinstance(
        getattr(tokenizer, "proto", None), bytes
    ):
        raise TypeError(
            f"Cannot export a translator whose tokenizer is a "
            f"{type(tokenizer).__name__}: the SavedModel tokenizes with "
            "tensorflow-text's SentencePiece op, which takes a "
            "SubwordTokenizer or a MarianTokenizer."
        )
    check_length_settings(
        config.max_length,
        config.max_length_offset,
        translator.model.max_sequence_length,
    )
    check_settings(
        config.method,
        config.beam_size,
        config.num_return_sequences,
        config.length_penalty,
        config.length_penalty_style,
        config.early_stopping,
        config.temperature,
        config.top_k,
        config.top_p,
    )


# --- files


def _export_in_subprocess(translator, directory):
    """Saves ``translator`` and exports it from a TensorFlow process."""
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="keras-transformer-") as saved:
        translator.save(saved)
        process = subprocess.run(
            [
                sys.executable,
                "-m",
                "keras_transformer.export",
                saved,
                directory,
            ],
            env=environment,
            capture_output=True,
            text=True,
        )
    if process.returncode != 0:
        lines = [line for line in process.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {process.returncode}"
        raise RuntimeError(
            "Exporting under TensorFlow (a subprocess with "
            f"KERAS_BACKEND=tensorflow) failed: {last}"
        )


# --- the graph


def _write_saved_model(translator, directory):
    import tensorflow as tf

    text = _text_ops(translator)
    serve = tf.function(
        _serving_function(translator, text),
        input_signature=[tf.TensorSpec([None], tf.string, name="sentences")],
        autograph=False,
    )
    # Traced once here; saving a concrete function does not trace again.
    signature = serve.get_concrete_function()
    root = tf.Module()
    # What the graph reads: the model's weights and the tokenizer's
    # SentencePiece models and lookup tables.
    root.model_variables = list(signature.variables)
    root.text_resources = list(text.resources)
    tf.saved_model.save(root, directory, signatures={SIGNATURE: signature})


def _serving_function(translator, text):
    """``serve(sentences) -> {"translations", "scores"}``, to be traced."""
    import tensorflow as tf

    config = translator.generation_config
    tokenizer = translator.tokenizer
    limit = translator.model.max_sequence_length
    # Every source is padded to the model's longest; the output buffer
    # (and the decoder cache) is the longest output any source may get.
    buffer_length = config.max_length or limit
    key = search_key(
        config.method,
        bucket_batch(config.batch_size),
        buffer_length,
        beam_size=config.beam_size,
        num_return_sequences=config.num_return_sequences,
        length_penalty_style=config.length_penalty_style,
        early_stopping=config.early_stopping,
        force_end_token=config.force_end_token,
        renormalize=config.renormalize,
    )
    search = translator.generator.search_function(key)

    def serve(sentences):
        blank = tf.strings.regex_full_match(sentences, f"{WHITESPACE}*")
        # One place is the end token: `Translator._tokenize` truncates so.
        tokens = text.tokenize(sentences)[:, : limit - 1]
        counts = tf.cast(tokens.row_lengths(), tf.int32)[:, None]
        positions = tf.range(limit, dtype=tf.int32)[None, :]
        ids = tokens.to_tensor(tokenizer.pad_id, shape=[None, limit])
        ids = tf.where(positions == counts, tokenizer.end_id, ids)
        mask = tf.cast(positions <= counts, tf.int32)
        if config.max_length is None:
            # The paper's "input length + 50", the end token counted.
            row_limits = tf.minimum(
                counts[:, 0] + 1 + config.max_length_offset, limit
            )
        else:
            row_limits = tf.fill(tf.shape(sentences), config.max_length)
        params = search_params(
            config.length_penalty, config.num_return_sequences
        )
        token_ids, lengths, scores = _search_in_chunks(
            search, key, tokenizer, (ids, mask, row_limits), params
        )
        hypotheses = tf.RaggedTensor.from_tensor(
            token_ids, lengths=tf.cast(lengths, tf.int64)
        )
        # Drops the end token (at most one per hypothesis, its last).
        hypotheses = tf.ragged.boolean_mask(
            hypotheses, tf.not_equal(hypotheses, tokenizer.end_id)
        )
        translations = text.detokenize(hypotheses)
        return {
            "translations": tf.where(blank, "", translations),
            "scores": tf.where(blank, 0.0, scores),
        }

    return serve


def _search_in_chunks(search, key, tokenizer, sources, params):
    """Runs the compiled ``search`` on ``key.batch_size`` sources at a
    time; returns the best hypothesis of each: ``(token_ids, lengths,
    scores)``."""
    import tensorflow as tf

    ids, mask, row_limits = sources
    chunk, width = key.batch_size, ids.shape[1]
    count = tf.shape(ids)[0]
    fillers = (chunk - count % chunk) % chunk
    # Filler sources, as `Generator.generate` pads a batch: a lone end
    # token with a limit of one token, finished after one step.
    filler_ids = np.full((1, width), tokenizer.pad_id, "int32")
    filler_ids[0, 0] = tokenizer.end_id
    filler_mask = np.zeros((1, width), "int32")
    filler_mask[0, 0] = 1
    ids = tf.concat([ids, tf.tile(filler_ids, [fillers, 1])], 0)
    mask = tf.concat([mask, tf.tile(filler_mask, [fillers, 1])], 0)
    row_limits = tf.concat([row_limits, tf.ones([fillers], tf.int32)], 0)

    def decode(batch):
        hypotheses = search(*batch, None, params)
        return (
            tf.cast(hypotheses.token_ids[:, 0], tf.int32),
            tf.cast(hypotheses.lengths[:, 0], tf.int32),
            tf.cast(hypotheses.scores[:, 0], tf.float32),
        )

    outputs = tf.map_fn(
        decode,
        (
            tf.reshape(ids, [-1, chunk, width]),
            tf.reshape(mask, [-1, chunk, width]),
            tf.reshape(row_limits, [-1, chunk]),
        ),
        fn_output_signature=(
            tf.TensorSpec([chunk, key.max_length], tf.int32),
            tf.TensorSpec([chunk], tf.int32),
            tf.TensorSpec([chunk], tf.float32),
        ),
        parallel_iterations=1,
    )
    token_ids, lengths, scores = (
        tf.reshape(value, tf.concat([[-1], tf.shape(value)[2:]], 0))[:count]
        for value in outputs
    )
    return token_ids, lengths, scores


# --- tokenization


@dataclasses.dataclass
class TextOps:
    """The tokenizer of a translator as TensorFlow ops.

    Attributes:
        tokenize: ``(n,) tf.string -> (n, None)`` ragged int32 ids,
            without the end token.
        detokenize: ``(n, None)`` ragged int32 ids (no end token) ``->
            (n,) tf.string``.
        resources: what the SavedModel must keep for them (SentencePiece
            models, lookup tables).
    """

    tokenize: typing.Callable
    detokenize: typing.Callable
    resources: list


def _text_ops(translator):
    tokenizer = translator.tokenizer
    if isinstance(tokenizer, marian.MarianTokenizer):
        return _marian_text_ops(tokenizer, translator.generator.vocabulary_size)
    return _subword_text_ops(tokenizer)


def _subword_text_ops(tokenizer):
    """A `SubwordTokenizer`: one SentencePiece model both ways (its
    `detokenize` drops padding and start ids, which a search never
    emits)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    model = tf_text.SentencepieceTokenizer(
        model=tokenizer.proto, out_type=tf.int32
    )
    return TextOps(model.tokenize, model.detokenize, [model])


def _marian_text_ops(tokenizer, vocabulary_size):
    """A `marian.MarianTokenizer`: source pieces to ids through Marian's
    vocabulary (a language code kept whole), ids to pieces through the
    target vocabulary, joined by the target SentencePiece model."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    source = tf_text.SentencepieceTokenizer(
        model=tokenizer.source_spm, out_type=tf.string
    )
    target = tf_text.SentencepieceTokenizer(
        model=tokenizer.target_spm, out_type=tf.string
    )
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(tokenizer.vocab), tf.string),
            tf.constant(list(tokenizer.vocab.values()), tf.int64),
        ),
        default_value=tokenizer.unk_id,
    )
    pieces = tf.constant(_marian_target_pieces(tokenizer, vocabulary_size))

    def tokenize(sentences):
        has_code = tf.strings.regex_full_match(sentences, _LANGUAGE_CODE)
        codes = tf.strings.regex_replace(sentences, _LANGUAGE_CODE, r"\1")
        rest = tf.strings.regex_replace(
            sentences, _LANGUAGE_CODE_PREFIX, "", replace_global=False
        )
        code_ids = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(table.lookup(codes), has_code),
            tf.cast(has_code, tf.int64),
        )
        ids = tf.concat([code_ids, table.lookup(source.tokenize(rest))], 1)
        return tf.cast(ids, tf.int32)

    def detokenize(ids):
        strings = tf.gather(pieces, ids)
        strings = tf.ragged.boolean_mask(
            strings, tf.strings.length(strings) > 0
        )
        text = target.detokenize(strings)
        text = tf.strings.regex_replace(text, _SPIECE_UNDERLINE, " ")
        return strip(text)

    return TextOps(tokenize, detokenize, [source, target, table])


def _marian_target_pieces(tokenizer, vocabulary_size):
    """The piece of each output id as `MarianTokenizer.detokenize` takes
    it: from the target vocabulary, else the target SentencePiece model,
    else none; ``""`` for the special ids it drops."""
    import sentencepiece

    model = sentencepiece.SentencePieceProcessor()
    model.LoadFromSerializedProto(tokenizer.target_spm)
    vocab = tokenizer.target_vocab or tokenizer.vocab
    by_id = {i: piece for piece, i in vocab.items()}
    special = {
        vocab[token]
        for token in (
            tokenizer.eos_token,
            tokenizer.pad_token,
            tokenizer.unk_token,
        )
        if token in vocab
    }
    size = max(vocabulary_size, max(by_id) + 1)
    pieces = []
    for i in range(size):
        fallback = model.IdToPiece(i) if i < len(model) else ""
        pieces.append("" if i in special else by_id.get(i, fallback))
    return np.array(pieces, dtype=object)


def strip(text):
    """``str.strip`` of a ``tf.string`` tensor: Python's whitespace
    (`WHITESPACE`) removed at both ends."""
    import tensorflow as tf

    return tf.strings.regex_replace(text, f"^{WHITESPACE}+|{WHITESPACE}+$", "")


# --- the command the export subprocess runs


def main(argv=None):
    """``python -m keras_transformer.export SAVED_DIR OUT_DIR``: exports
    the translator saved in ``SAVED_DIR`` (`Translator.save`); run with
    ``KERAS_BACKEND=tensorflow``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 2:
        print(
            "usage: python -m keras_transformer.export SAVED_DIR OUT_DIR",
            file=sys.stderr,
        )
        return 2
    try:
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                f"The export runs under TensorFlow; the Keras backend is "
                f"{keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow."
            )
        from keras_transformer.generation import Translator

        export_translator(Translator.from_pretrained(args[0]), args[1])
    except Exception as error:
        traceback.print_exc()
        # The caller reports the last line.
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
