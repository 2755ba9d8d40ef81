"""The joint source-target subword tokenizer (SentencePiece).

The paper encodes both languages with one shared vocabulary of about 37k
byte-pair-encoding tokens (section 5.1). `train_tokenizer` trains such a
vocabulary with the `sentencepiece` library. `SubwordTokenizer` encodes
Python text with that library (no TensorFlow: a translator on JAX or
torch never imports it) and tokenizes inside tf.data graphs and exported
SavedModels with tensorflow-text's op over the same model, which gives
the same ids; both detokenize back to text.
"""

import contextlib
import io
import os
import sys
import tempfile

import numpy as np
import sentencepiece as spm

from keras_transformer.data.corpus import read_lines
from keras_transformer.io_utils import read_json, write_json

PAD_ID = 0
UNK_ID = 1
START_ID = 2
END_ID = 3

MODEL_FILENAME = "tokenizer.model"
CONFIG_FILENAME = "tokenizer.json"
_FORMAT_VERSION = 1


class _NotAModelError(ValueError):
    """Bytes that are not a SentencePiece model; ``problem`` says how."""

    def __init__(self, problem):
        super().__init__(
            f"proto is not a SentencePiece model: {problem}; pass the "
            f"bytes of a {MODEL_FILENAME} file."
        )
        self.problem = problem


def _parse_model(proto):
    """The `sentencepiece` processor of a serialized model."""
    if not proto:
        raise _NotAModelError("it is empty")
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except RuntimeError as error:
        raise _NotAModelError(
            f"its {len(proto)} bytes do not parse as a SentencePiece "
            "model protocol buffer"
        ) from error
    if processor.get_piece_size() == 0:
        raise _NotAModelError(f"its {len(proto)} bytes hold no pieces")
    return processor


# The info lines of the SentencePiece copy inside tensorflow-text (its op
# says "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use
# identity normalization." when it loads a model trained with identity
# normalization). That copy has a logger of its own, out of reach of
# TF_CPP_MIN_LOG_LEVEL and of `sentencepiece.set_min_log_level`.
_SENTENCEPIECE_INFO = b") LOG(INFO) "


def _tensorflow_info_hidden():
    """Whether TensorFlow's info logs are hidden (TF_CPP_MIN_LOG_LEVEL of
    1 or more, which `keras-transformer` sets unless --verbose)."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0").strip()
    return level.isdigit() and int(level) >= 1


@contextlib.contextmanager
def _sentencepiece_info_hidden():
    """Drops the SentencePiece info lines that tensorflow-text's op
    writes to file descriptor 2 inside the block, when TensorFlow's own
    info logs are hidden; anything else written there meanwhile is
    passed on after the block."""
    if not _tensorflow_info_hidden():
        yield
        return
    with tempfile.TemporaryFile() as captured:
        try:
            saved = os.dup(2)
        except OSError:  # no standard error to filter
            yield
            return
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(
                line
                for line in captured.read().splitlines(keepends=True)
                if _SENTENCEPIECE_INFO not in line
            )
            while kept:
                kept = kept[os.write(2, kept) :]


def _describe(value):
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                return f"item {i} of type {type(item).__name__}: {item!r}"
    return f"a {type(value).__name__}"


class SubwordTokenizer:
    """A SentencePiece subword tokenizer shared by source and target.

    Ids 0 to 3 are reserved: ``pad_id`` (0), ``unk_id`` (1), ``start_id``
    (2) and ``end_id`` (3). Neither `encode` nor `tokenize` adds start or
    end ids; the input pipeline and the translator add them.

    Two ways to the same ids: `encode` runs the `sentencepiece` library
    on Python text and returns lists, without TensorFlow; `tokenize`
    runs tensorflow-text's op, which also works on (symbolic) string
    tensors inside a tf.data map or a SavedModel, and imports TensorFlow
    on first use. `detokenize` needs no TensorFlow.

    Build one with `train_tokenizer` or `load_tokenizer`; the constructor
    takes a serialized SentencePiece model.

    Args:
        proto: the serialized SentencePiece model (bytes), whose special
            pieces have the reserved ids above.
        config: optional dict of metadata saved next to the model (the
            training settings).

    Example:
    >>> tokenizer = train_tokenizer(["train.en", "train.de"], 8000)
    >>> ids = tokenizer.encode(["A man rides a bike."])
    >>> tokenizer.detokenize(ids)
    ['A man rides a bike.']
    """

    def __init__(self, proto, config=None):
        if not isinstance(proto, bytes):
            raise TypeError(
                "proto must be the bytes of a SentencePiece model, got "
                f"{type(proto).__name__}. Use load_tokenizer(directory) to "
                "read a saved tokenizer."
            )
        self._proto = proto
        self._processor = _parse_model(proto)
        expected = {
            "pad_id": PAD_ID,
            "unk_id": UNK_ID,
            "bos_id": START_ID,
            "eos_id": END_ID,
        }
        for name, value in expected.items():
            actual = getattr(self._processor, name)()
            if actual != value:
                raise ValueError(
                    f"The SentencePiece model has {name}={actual}, but this "
                    f"package reserves {name}={value}. Train the model with "
                    "keras_transformer.data.train_tokenizer, or pass "
                    "pad_id=0, unk_id=1, bos_id=2, eos_id=3 to the "
                    "SentencePiece trainer."
                )
        # tensorflow-text's op, made on the first `tokenize`.
        self._tf_tokenizer = None
        self.config = dict(config or {})

    def _new_tf_tokenizer(self):
        import tensorflow as tf
        import tensorflow_text as tf_text

        with _sentencepiece_info_hidden():
            return tf_text.SentencepieceTokenizer(
                model=self._proto, out_type=tf.int32
            )

    def _refresh(self):
        """Creates the tensorflow-text op, or recreates it if its
        resource is gone.

        The op's model lives in a TensorFlow resource owned by a cached
        kernel; `tf.random.set_seed` (and `keras.utils.set_random_seed`)
        clear that cache, after which the old handle fails with NotFound.
        """
        import tensorflow as tf

        # Made eagerly, also while a graph is traced: the graph captures
        # the handle of a resource that outlives it.
        with tf.init_scope():
            if self._tf_tokenizer is None:
                self._tf_tokenizer = self._new_tf_tokenizer()
                return
            try:
                self._tf_tokenizer.tokenize(tf.constant([""]))
            except tf.errors.NotFoundError:
                self._tf_tokenizer = self._new_tf_tokenizer()

    pad_id = PAD_ID
    unk_id = UNK_ID
    start_id = START_ID
    end_id = END_ID

    @property
    def vocabulary_size(self):
        """Number of ids, reserved ones included."""
        return self._processor.get_piece_size()

    @property
    def proto(self):
        """The serialized SentencePiece model."""
        return self._proto

    def encode(self, inputs):
        """Subword ids of text, without start or end ids, computed with
        the `sentencepiece` library (no TensorFlow).

        Gives the ids of `tokenize`: the same model, no sampling, no
        added start or end.

        Args:
            inputs: a str, or a list (or tuple) of str.

        Returns:
            A list of int for a str; a list of lists of int for a list.
        """
        if isinstance(inputs, str):
            return self._processor.encode(inputs)
        if not isinstance(inputs, (list, tuple)) or not all(
            isinstance(text, str) for text in inputs
        ):
            raise TypeError(
                "encode expects a str or a list of str; got "
                f"{_describe(inputs)}. Use tokenize for string tensors."
            )
        return self._processor.encode(list(inputs))

    def tokenize(self, inputs):
        """Subword ids of text as TensorFlow tensors, without start or
        end ids (tensorflow-text's op; imports TensorFlow).

        Use it inside tf.data maps and TensorFlow graphs; `encode` gives
        the same ids as Python lists without TensorFlow.

        Args:
            inputs: a str, a list of str, or a tf string tensor (also a
                symbolic one inside a tf.data map).

        Returns:
            int32 ids: a 1-D tensor for a single string, a
            ``tf.RaggedTensor`` of shape ``(batch, None)`` for a batch.
        """
        import tensorflow as tf

        if isinstance(inputs, (list, tuple)):
            inputs = tf.constant(
                list(inputs), dtype=tf.string, shape=[len(inputs)]
            )
        elif isinstance(inputs, (str, bytes)):
            inputs = tf.constant(inputs, dtype=tf.string)
        if self._tf_tokenizer is not None and tf.executing_eagerly():
            try:
                return self._tf_tokenizer.tokenize(inputs)
            except tf.errors.NotFoundError:
                self._tf_tokenizer = self._new_tf_tokenizer()
        else:
            # Tracing a graph (a tf.data map) captures the op's resource
            # handle, which must be alive.
            self._refresh()
        return self._tf_tokenizer.tokenize(inputs)

    def _clean(self, ids):
        """Drops pad and start ids, and the end id and all after it."""
        ids = [int(i) for i in ids]
        if END_ID in ids:
            ids = ids[: ids.index(END_ID)]
        return [i for i in ids if i not in (PAD_ID, START_ID)]

    def detokenize(self, ids):
        """Text of ids.

        Pad and start ids are dropped, and so is the first end id with
        everything after it (what a decoder emits after it finishes).

        Args:
            ids: a ``tf.RaggedTensor``, a dense tensor or numpy array
                (1-D or 2-D), or a list (of lists) of ints.

        Returns:
            A list of str for a batch, a str for a single sequence.
        """
        if hasattr(ids, "to_list"):  # a tf.RaggedTensor
            ids = ids.to_list()
        elif isinstance(ids, (list, tuple)):
            ids = list(ids)
        else:
            ids = np.asarray(ids)
            if ids.ndim not in (1, 2):
                raise ValueError(
                    f"detokenize expects 1-D or 2-D ids, got shape "
                    f"{ids.shape}. Pass one sequence or a batch of them."
                )
            if not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(
                    f"detokenize expects integer ids, got dtype {ids.dtype}."
                    " Take the argmax of logits before detokenizing."
                )
            ids = ids.tolist()
        single = not ids or not isinstance(ids[0], (list, tuple, np.ndarray))
        if single:
            return self._processor.decode(self._clean(ids))
        return self._processor.decode([self._clean(row) for row in ids])

    def id_to_token(self, ids):
        """The subword piece of an id (or a list of pieces for a list)."""
        if isinstance(ids, (int, np.integer)):
            return self._processor.id_to_piece(self._check_id(ids))
        return [self.id_to_token(int(i)) for i in np.asarray(ids).ravel()]

    def token_to_id(self, token):
        """The id of a subword piece; `unk_id` if it is not one."""
        return self._processor.piece_to_id(token)

    def _check_id(self, i):
        i = int(i)
        if not 0 <= i < self.vocabulary_size:
            raise ValueError(
                f"Token id {i} is outside the vocabulary [0, "
                f"{self.vocabulary_size}). Check that the model and the "
                "tokenizer were built for the same vocabulary."
            )
        return i

    def save(self, directory):
        """Writes ``tokenizer.model`` and ``tokenizer.json`` to a directory.

        No pickle: the SentencePiece model file and a small JSON file of
        metadata. `load_tokenizer` reads them back.
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, MODEL_FILENAME), "wb") as f:
            f.write(self._proto)
        config = {
            "format_version": _FORMAT_VERSION,
            "vocabulary_size": self.vocabulary_size,
            "pad_id": PAD_ID,
            "unk_id": UNK_ID,
            "start_id": START_ID,
            "end_id": END_ID,
            **self.config,
        }
        write_json(os.path.join(directory, CONFIG_FILENAME), config)

    def __repr__(self):
        return f"SubwordTokenizer(vocabulary_size={self.vocabulary_size})"


def load_tokenizer(directory):
    """Loads a tokenizer written by `SubwordTokenizer.save`.

    Args:
        directory: the directory holding ``tokenizer.model`` and
            ``tokenizer.json``.

    Returns:
        A `SubwordTokenizer`.
    """
    directory = os.fspath(directory)
    paths = [
        os.path.join(directory, n) for n in (MODEL_FILENAME, CONFIG_FILENAME)
    ]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"No tokenizer file at {path!r}. load_tokenizer expects the "
                f"directory written by tokenizer.save(directory) (files "
                f"{MODEL_FILENAME} and {CONFIG_FILENAME})."
            )
    config = read_json(paths[1])
    if not isinstance(config, dict):
        raise ValueError(
            f"{paths[1]} holds a JSON {type(config).__name__}, not the "
            "object tokenizer.save writes; re-save the tokenizer, or "
            "re-download or re-save the translator that holds it."
        )
    version = config.pop("format_version", None)
    if version != _FORMAT_VERSION:
        raise ValueError(
            f"{paths[1]} has format_version={version!r}; this version of "
            f"keras-transformer reads format_version={_FORMAT_VERSION}. "
            "Upgrade keras-transformer or retrain the tokenizer."
        )
    saved_size = config.pop("vocabulary_size", None)
    for name in ("pad_id", "unk_id", "start_id", "end_id"):
        config.pop(name, None)
    tokenizer = read_model_file(paths[0], config)
    if saved_size != tokenizer.vocabulary_size:
        raise ValueError(
            f"{paths[1]} says vocabulary_size={saved_size} but "
            f"{paths[0]} has {tokenizer.vocabulary_size} pieces. The two "
            "files come from different tokenizers; save the tokenizer again."
        )
    return tokenizer


def read_model_file(path, config=None):
    """A `SubwordTokenizer` of a SentencePiece model file (``config``: its
    metadata); a file that is not a model is named in the error."""
    with open(path, "rb") as f:
        proto = f.read()
    try:
        return SubwordTokenizer(proto, config=config)
    except _NotAModelError as error:
        raise ValueError(
            f"{path} is not a SentencePiece model: {error.problem}; "
            "re-save the tokenizer, or re-download or re-save the "
            "translator that holds it."
        ) from error


def train_tokenizer(
    files=None,
    vocabulary_size=8000,
    model_type="bpe",
    *,
    sentences=None,
    character_coverage=1.0,
    byte_fallback=True,
    max_sentences=2_000_000,
    seed=0,
    num_threads=None,
):
    """Trains a joint subword vocabulary on source and target text.

    Uses SentencePiece with identity normalization (text is not rewritten,
    so detokenization restores it exactly) and byte fallback (a character
    missing from the vocabulary becomes its UTF-8 bytes instead of the
    unknown id). Sizes: about 8k for Multi30k, 37k for WMT14 EN-DE as in
    the paper (section 5.1).

    Args:
        files: paths of UTF-8 text files (plain or gzip), one sentence per
            line, typically the source and target sides of the training
            corpus.
        vocabulary_size: number of ids, the 4 reserved ones included.
        model_type: ``"bpe"`` (the paper's byte-pair encoding) or
            ``"unigram"``.
        sentences: instead of (or besides) files, a list of str.
        character_coverage: fraction of characters covered by single-piece
            ids; the rest use byte fallback.
        byte_fallback: encode unknown characters as UTF-8 bytes.
        max_sentences: train on a random sample of at most this many
            sentences (large corpora such as WMT14).
        seed: seed of that sample.
        num_threads: trainer threads (default: the CPU count).

    Returns:
        A `SubwordTokenizer`.

    Example:
    >>> tokenizer = train_tokenizer(["train.en", "train.de"], 8000)
    >>> tokenizer.vocabulary_size
    8000
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError(
            f"model_type={model_type!r} is not supported. Use 'bpe' (the "
            "paper's byte-pair encoding) or 'unigram'."
        )
    if int(vocabulary_size) != vocabulary_size or vocabulary_size < 8:
        raise ValueError(
            f"vocabulary_size={vocabulary_size} must be an integer of at "
            "least 8 (4 ids are reserved); about 8000 suits Multi30k."
        )
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    text = []
    for path in files or []:
        text.extend(line for line in read_lines(path) if line)
    text.extend(s for s in (sentences or []) if s)
    if not text:
        raise ValueError(
            "train_tokenizer got no text: pass files=[...] (e.g. the "
            "source and target training files) or sentences=[...]."
        )
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text),
            model_writer=model,
            vocab_size=int(vocabulary_size),
            model_type=model_type,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=START_ID,
            eos_id=END_ID,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            input_sentence_size=int(max_sentences),
            shuffle_input_sentence=True,
            max_sentence_length=1 << 16,
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as error:
        message = str(error)
        if "smaller than required_chars" in message:
            raise ValueError(
                f"vocabulary_size={vocabulary_size} is too small for the "
                "characters of this training text. SentencePiece says: "
                f"{message.strip()} Raise vocabulary_size (byte fallback "
                "alone takes 256 ids)."
            ) from error
        if "Vocabulary size" in message:
            raise ValueError(
                f"vocabulary_size={vocabulary_size} is too large for this "
                f"training text ({len(text)} sentences). SentencePiece "
                f"says: {message.strip()} Lower vocabulary_size or train on "
                "more text."
            ) from error
        raise
    config = {
        "model_type": model_type,
        "character_coverage": character_coverage,
        "byte_fallback": byte_fallback,
        "normalization": "identity",
        "training_sentences": min(len(text), int(max_sentences)),
    }
    return SubwordTokenizer(model.getvalue(), config=config)
