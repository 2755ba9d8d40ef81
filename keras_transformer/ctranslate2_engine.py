"""Serving a `Translator` with CTranslate2, the engine built for fast
Transformer decoding on CPUs.

`export_ctranslate2(translator, directory)` writes a CTranslate2 model
directory through CTranslate2's own converter API: a
``ctranslate2.converters.Converter`` whose specification
(``TransformerSpec``) is filled from the `Transformer`'s weights, with
the translator's tokenizer and generation settings beside it.
`CTranslate2Translator` translates strings with such an export, as
`Translator` does (tokenization, truncation, empty sentences, batches
sorted by length, n-best lists, scores):

>>> from keras_transformer.ctranslate2_engine import CTranslate2Translator
>>> translator.export("served/", format="ctranslate2", quantization="int8")
>>> CTranslate2Translator("served/").translate(["A man rides a bike."])

What CTranslate2 decodes differently from `keras_transformer.generation`
(see docs/serving.md): it has no GNMT length penalty (it divides by
``|Y| ** alpha``, the ``"hf"`` style), its beam search stops when
``beam_size`` hypotheses have finished (``transformers``'
``early_stopping=True``), it renormalizes the distribution after
removing the banned tokens, it cannot force the end token (the limit is
one token shorter instead), and its random sampling draws other
numbers.
"""

import math
import os
import warnings

import keras
import numpy as np

from keras_transformer.generation.base import (
    BaseTranslator,
    Hypothesis,
    load_tokenizer_directory,
)
from keras_transformer.generation.config import GenerationConfig
from keras_transformer.generation.generator import (
    check_length_settings,
    hypothesis_lengths,
)
from keras_transformer.generation.search import length_penalty
from keras_transformer.io_utils import (
    read_json,
    replace_directory_atomically,
    write_json,
)
from keras_transformer.version import __version__

EXTRA = "ctranslate2"
INSTALL = f'pip install "keras-transformer[{EXTRA}]"'
# CTranslate2's weight types, chosen at export (``quantization``) or when
# loading (``compute_type``).
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
# This package's files beside CTranslate2's model.bin and config.json.
METADATA_FILE = "keras_transformer.json"
TOKENIZER_DIR = "tokenizer"
FORMAT_VERSION = 1
# Keras activation names and CTranslate2's ``Activation`` members.
ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "silu": "SWISH",
    "swish": "SWISH",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
}


class MissingDependencyError(ImportError):
    """CTranslate2 is not installed; the message says which extra to
    install."""


def require_ctranslate2():
    """The ``ctranslate2`` module, or a `MissingDependencyError` saying
    how to install it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise MissingDependencyError(
            f"The CTranslate2 engine needs the ctranslate2 package, which "
            f"is not installed ({error}); install it with {INSTALL}."
        ) from None
    return ctranslate2


def check_quantization(quantization):
    """Raises a ValueError for a weight type CTranslate2 does not have
    (None keeps the export's)."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={quantization!r} is not one of CTranslate2's "
            f"weight types {QUANTIZATIONS}; pass e.g. 'int8'."
        )


def is_export(directory):
    """Whether ``directory`` holds an export of `export_ctranslate2`."""
    return os.path.isfile(os.path.join(directory, METADATA_FILE))


# --- the export


def export_ctranslate2(translator, directory, quantization=None):
    """Writes ``translator`` as a CTranslate2 model directory.

    The model is converted by CTranslate2's converter API (its
    ``Converter.convert`` validates the specification, quantizes the
    weights and writes ``model.bin``, ``config.json`` and the
    vocabularies); ``tokenizer/`` and ``keras_transformer.json`` (the
    generation settings and the length limit) are written beside them.
    Everything is written next to ``directory`` and renamed into place,
    so a failed export leaves ``directory`` as it was.

    Args:
        translator: a `keras_transformer.Translator`: post-norm or
            pre-norm, shared or separate vocabularies, with or without
            an output bias, float or int8 weights, on any backend.
        directory: the export directory (replaced).
        quantization: the stored weight type, one of `QUANTIZATIONS`;
            by default float32, or int8 for an int8 translator (whose
            int8 values and scales are kept as they are).

    Returns:
        ``directory``.
    """
    ctranslate2 = require_ctranslate2()
    check_quantization(quantization)
    if quantization is None and translator.quantization_mode == "int8":
        quantization = "int8"
    spec = transformer_spec(translator)

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    def write(staging):
        model = os.path.join(staging, "model")
        _Converter().convert(model, quantization=quantization, force=True)
        for name in os.listdir(model):
            os.rename(os.path.join(model, name), os.path.join(staging, name))
        os.rmdir(model)
        translator.tokenizer.save(os.path.join(staging, TOKENIZER_DIR))
        write_json(
            os.path.join(staging, METADATA_FILE),
            {
                "format_version": FORMAT_VERSION,
                "version": __version__,
                "quantization": quantization or "float32",
                "max_sequence_length": translator.max_sequence_length,
                "generation_config": translator.generation_config.to_dict(),
            },
        )

    directory = os.path.abspath(os.fspath(directory))
    replace_directory_atomically(directory, write)
    return directory


def transformer_spec(translator):
    """CTranslate2's ``TransformerSpec`` of a translator's model, with
    its weights (float32 arrays), vocabularies and special tokens."""
    from ctranslate2.specs import common_spec
    from ctranslate2.specs.transformer_spec import TransformerSpec

    model = translator.model
    activation = ACTIVATIONS.get(model.activation)
    if activation is None:
        raise ValueError(
            f"activation={model.activation!r} has no CTranslate2 "
            f"counterpart; CTranslate2 serves {sorted(ACTIVATIONS)}."
        )
    spec = TransformerSpec.from_config(
        (model.num_encoder_layers, model.num_decoder_layers),
        model.num_heads,
        pre_norm=model.normalize_first,
        activation=getattr(common_spec.Activation, activation),
    )
    _set_ends(spec.encoder, model, "encoder")
    _set_ends(spec.decoder, model, "decoder")
    spec.encoder.embeddings[0].weight = _embeddings(
        model.encoder_token_embedding
    )
    target = _embeddings(model.decoder_token_embedding)
    spec.decoder.embeddings.weight = target
    _set_projection(spec.decoder.projection, model, target)
    for layer_spec, layer in zip(
        spec.encoder.layer, model.encoder_layers, strict=True
    ):
        _set_self_attention(layer_spec, layer)
        _set_feed_forward(layer_spec.ffn, layer)
    for layer_spec, layer in zip(
        spec.decoder.layer, model.decoder_layers, strict=True
    ):
        _set_self_attention(layer_spec, layer)
        cross = layer.cross_attention
        _set_linear(layer_spec.attention.linear[0], cross.query_dense)
        _set_linear(
            layer_spec.attention.linear[1], cross.key_dense, cross.value_dense
        )
        _set_linear(layer_spec.attention.linear[2], cross.output_dense)
        _set_norm(layer_spec.attention.layer_norm, layer.cross_attention_norm)
        _set_feed_forward(layer_spec.ffn, layer)
    _set_vocabularies(spec, translator)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    return spec


def _numpy(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable), "float32")


def _embeddings(embedding):
    """A `TokenEmbedding`'s ``(vocabulary, hidden_dim)`` float32 matrix;
    an int8 one as its int8 values over its scale per token (the values
    quantize back to themselves)."""
    matrix = _numpy(embedding.embeddings)
    if embedding.quantization_mode == "int8":
        matrix = matrix / _numpy(embedding.embeddings_scale)[:, None]
    return matrix


def _kernel(layer):
    """A ``Dense`` or head-projection ``EinsumDense`` kernel as an
    ``(outputs, inputs)`` matrix, CTranslate2's (and torch's) layout;
    an int8 kernel as its int8 values over its scale per output unit.
    The kernels' input axes come first, their output axes last."""
    kernel = _numpy(layer.kernel)
    inputs = _input_axes(layer)
    mode = layer.quantization_mode
    if mode not in (None, "int8"):
        raise ValueError(
            f"{layer.path} is quantized as {mode!r}; the CTranslate2 "
            "export takes float or int8 weights."
        )
    if mode == "int8":
        scale = _numpy(layer.kernel_scale)
        kernel = kernel / scale.reshape(kernel.shape[inputs:])
    return kernel.reshape(math.prod(kernel.shape[:inputs]), -1).T


def _input_axes(layer):
    """How many leading axes of the layer's kernel its inputs contract."""
    if not isinstance(layer, keras.layers.EinsumDense):
        return 1
    inputs, rest = layer.equation.split(",")
    return sum(axis in inputs for axis in rest.split("->")[0])


def _set_linear(spec, *layers):
    """``spec`` holds ``layers`` side by side (CTranslate2 fuses the
    query, key and value projections of self-attention, and the key and
    value projections of cross-attention, into one product)."""
    kernels = [_kernel(layer) for layer in layers]
    spec.weight = np.concatenate(kernels) if len(kernels) > 1 else kernels[0]
    if all(layer.bias is None for layer in layers):
        return
    spec.bias = np.concatenate(
        [
            np.zeros(kernel.shape[0], "float32")
            if layer.bias is None
            else _numpy(layer.bias).reshape(-1)
            for layer, kernel in zip(layers, kernels, strict=True)
        ]
    )


def _set_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_self_attention(layer_spec, layer):
    attention = layer.self_attention
    _set_linear(
        layer_spec.self_attention.linear[0],
        attention.query_dense,
        attention.key_dense,
        attention.value_dense,
    )
    _set_linear(layer_spec.self_attention.linear[1], attention.output_dense)
    _set_norm(layer_spec.self_attention.layer_norm, layer.self_attention_norm)


def _set_feed_forward(spec, layer):
    _set_linear(spec.linear_0, layer.feed_forward.intermediate_dense)
    _set_linear(spec.linear_1, layer.feed_forward.output_dense)
    _set_norm(spec.layer_norm, layer.feed_forward_norm)


def _set_ends(spec, model, side):
    """A stack's embedding scale, position table (section 3.5's
    sinusoids as the model computes them, row 0 for the first position)
    and final norm (pre-norm models)."""
    embedding = getattr(model, f"{side}_token_embedding")
    spec.scale_embeddings = (
        math.sqrt(model.hidden_dim) if embedding.scale else False
    )
    table = getattr(model, f"{side}_position_encoding")(
        keras.ops.zeros((1, model.max_sequence_length, model.hidden_dim))
    )
    spec.position_encodings.encodings = _numpy(table)[0]
    norm = getattr(model, f"{side}_final_norm")
    if norm is not None:
        _set_norm(spec.layer_norm, norm)


def _set_projection(spec, model, target_embeddings):
    """The pre-softmax projection: the target embedding matrix (tied,
    section 3.4) or its own kernel, plus the logits' bias if any."""
    if model.output_projection is None:
        spec.weight = target_embeddings
        bias = None
    else:
        _set_linear(spec, model.output_projection)
        bias = spec.bias if spec.has_bias() else None
    if model.output_bias is not None:
        extra = _numpy(model.output_bias.bias)
        bias = extra if bias is None else bias + extra
    if bias is not None:
        spec.bias = bias


def _set_vocabularies(spec, translator):
    model, tokenizer = translator.model, translator.tokenizer
    source = vocabulary_tokens(tokenizer, model.vocabulary_size, "source")
    target_size = model.target_vocabulary_size or model.vocabulary_size
    target = vocabulary_tokens(tokenizer, target_size, "target")
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    config = spec.config
    config.unk_token = target[tokenizer.unk_id]
    config.bos_token = target[tokenizer.start_id]
    config.eos_token = target[tokenizer.end_id]
    config.decoder_start_token = target[tokenizer.start_id]
    # The encoder's input is the source's pieces and the end token, as
    # in the training pipeline: CTranslate2 appends it.
    config.add_source_eos = True
    if source[tokenizer.end_id] != config.eos_token:
        raise ValueError(
            f"The source and target vocabularies name the end token id "
            f"{tokenizer.end_id} differently ({source[tokenizer.end_id]!r}, "
            f"{config.eos_token!r}); CTranslate2 needs one end token."
        )


def vocabulary_tokens(tokenizer, size, side):
    """``size`` distinct token strings, the one of id ``i`` at ``i``: the
    tokenizer's pieces, and ``<id_i>`` for an id it has no unique piece
    for (rows of the model beyond the tokenizer's vocabulary)."""
    pieces = _pieces(tokenizer, side)
    tokens, seen = [], set()
    for i in range(size):
        token = pieces.get(i)
        if token is None or token in seen:
            token = f"<id_{i}>"
        seen.add(token)
        tokens.append(token)
    return tokens


def _pieces(tokenizer, side):
    """``{id: piece}`` of a `SubwordTokenizer` or a `MarianTokenizer`."""
    if hasattr(tokenizer, "id_to_token"):
        ids = range(tokenizer.vocabulary_size)
        return dict(zip(ids, tokenizer.id_to_token(list(ids)), strict=True))
    vocab = tokenizer.vocab
    if side == "target" and getattr(tokenizer, "target_vocab", None):
        vocab = tokenizer.target_vocab
    return {int(i): str(piece) for piece, i in vocab.items()}


# --- translating with an export


class CTranslate2Translator(BaseTranslator):
    """Translates sentences with an export of `export_ctranslate2`, as
    `Translator.translate` does with the model itself.

    The export's tokenizer gives the subword ids of each sentence, which
    are truncated to the model's length limit as `Translator` truncates
    them (with the same warning, or the `ValueError` of
    ``long_inputs="error"``); CTranslate2 decodes their pieces; the
    tokenizer turns the generated pieces back into text. The saved
    generation settings apply, with keyword overrides. Scores are this
    package's: the log-probability CTranslate2 reports, divided by the
    length penalty of the settings' style.

    Args:
        directory: an export written by `export_ctranslate2`
            (``Translator.export(directory, format="ctranslate2")``).
        compute_type: CTranslate2's ``compute_type``: ``"default"`` (the
            stored weight type) or one of `QUANTIZATIONS`.
        device: ``"cpu"`` or ``"cuda"``.
        intra_threads: threads per translation (0: CTranslate2's choice).
        **settings: `GenerationConfig` overrides.

    Example:
    >>> translator = CTranslate2Translator("served/", beam_size=4)
    >>> translator.translate(["A man rides a bike."])
    """

    def __init__(
        self,
        directory,
        compute_type="default",
        device="cpu",
        intra_threads=0,
        **settings,
    ):
        ctranslate2 = require_ctranslate2()
        if compute_type != "default":
            check_quantization(compute_type)
        directory = os.fspath(directory)
        metadata = _read_metadata(directory)
        self.directory = directory
        self.max_sequence_length = int(metadata["max_sequence_length"])
        config = GenerationConfig.from_dict(metadata["generation_config"])
        self.generation_config = config.replace(**settings)
        self.tokenizer = load_tokenizer_directory(
            os.path.join(directory, TOKENIZER_DIR)
        )
        self.source_tokens, self.target_tokens = _read_vocabularies(directory)
        self.target_ids = {t: i for i, t in enumerate(self.target_tokens)}
        self.engine = ctranslate2.Translator(
            directory,
            device=device,
            compute_type=compute_type,
            intra_threads=intra_threads,
        )
        self._ctranslate2 = ctranslate2
        self._warned = set()

    # --- settings

    def _check_config(self, config):
        check_length_settings(
            config.max_length,
            config.max_length_offset,
            self.max_sequence_length,
        )
        if config.method == "sample" and config.top_k > len(self.target_tokens):
            raise ValueError(
                f"top_k={config.top_k} is more than the "
                f"{len(self.target_tokens)} target tokens; pass a smaller "
                "top_k, or 0 for all."
            )
        if config.method != "beam":
            return
        if config.length_penalty_style == "gnmt":
            self._warn(
                "gnmt",
                "CTranslate2 has no GNMT length penalty ((5 + |Y|) / 6) ** "
                f"alpha; its beam search ranks by |Y| ** alpha with alpha="
                f"{config.length_penalty} instead (length_penalty_style="
                '"hf"), so translations can differ from Translator\'s.',
            )
        elif config.early_stopping is not True:
            self._warn(
                "early_stopping",
                f"early_stopping={config.early_stopping!r}: CTranslate2's "
                "beam search stops when beam_size hypotheses have "
                "finished (early_stopping=True), so translations can "
                "differ from Translator's.",
            )

    def _warn(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=5)

    def _options(self, config):
        """CTranslate2's ``translate_batch`` options of a config."""
        banned = {self.tokenizer.pad_id, self.tokenizer.start_id}
        options = dict(
            # Section 6.1's alpha; CTranslate2 divides by |Y| ** alpha.
            length_penalty=float(config.length_penalty),
            num_hypotheses=config.num_return_sequences,
            suppress_sequences=[[self.target_tokens[i]] for i in banned],
            # The sources are truncated here, as Translator truncates.
            max_input_length=0,
            # The end token may come first: an empty translation.
            min_decoding_length=0,
            return_scores=True,
            return_end_token=True,
            max_batch_size=config.batch_size,
        )
        if config.method == "sample":
            options.update(
                beam_size=1,
                sampling_topk=config.top_k,
                sampling_topp=float(config.top_p),
                sampling_temperature=float(config.temperature),
            )
        else:
            options["beam_size"] = (
                config.beam_size if config.method == "beam" else 1
            )
        return options

    def _limits(self, token_lists, config):
        """Each source's limit on generated tokens, the end token
        included: `Generator.generate`'s rule."""
        if config.max_length is not None:
            limits = [int(config.max_length)] * len(token_lists)
        else:
            limits = [
                min(
                    len(row) + 1 + config.max_length_offset,
                    self.max_sequence_length,
                )
                for row in token_lists
            ]
        if config.force_end_token:
            # CTranslate2 cannot force the end token as the last one: the
            # limit is one shorter, and a hypothesis cut there gets the
            # end token (probability 1) after it.
            limits = [max(limit - 1, 1) for limit in limits]
        return limits

    # --- translating

    def _translate_batch(self, token_lists, config):
        options = self._options(config)
        if config.method == "sample" and config.seed is not None:
            self._ctranslate2.set_random_seed(int(config.seed))
        limits = self._limits(token_lists, config)
        results = [None] * len(token_lists)
        # One CTranslate2 call per limit: its limit is one per call.
        for limit in sorted(set(limits)):
            rows = [i for i, value in enumerate(limits) if value == limit]
            outputs = self.engine.translate_batch(
                [[self.source_tokens[t] for t in token_lists[i]] for i in rows],
                max_decoding_length=limit,
                **options,
            )
            for i, output in zip(rows, outputs, strict=True):
                results[i] = self._hypotheses(output, limit, config)
        return results

    def _hypotheses(self, output, limit, config):
        """`Hypothesis` objects of one CTranslate2 result, best first."""
        end = self.tokenizer.end_id
        ids, log_probs = [], []
        for tokens, score in zip(output.hypotheses, output.scores, strict=True):
            row = [self.target_ids[t] for t in tokens]
            # CTranslate2's score is the sum over |Y| ** alpha.
            log_probs.append(score * len(row) ** config.length_penalty)
            if config.force_end_token and len(row) == limit and row[-1] != end:
                row.append(end)
            ids.append(row)
        padded = np.full((len(ids), max(map(len, ids))), self.tokenizer.pad_id)
        for k, row in enumerate(ids):
            padded[k, : len(row)] = row
        lengths = hypothesis_lengths(padded, end, self.tokenizer.pad_id)
        penalties = keras.ops.convert_to_numpy(
            length_penalty(
                lengths, config.length_penalty, config.length_penalty_style
            )
        )
        sequences = [row[:-1] if row and row[-1] == end else row for row in ids]
        texts = self.tokenizer.detokenize(sequences)
        texts = [texts] if isinstance(texts, str) else texts
        return [
            Hypothesis(
                text=texts[k],
                token_ids=sequences[k],
                score=float(log_probs[k] / penalties[k]),
                log_prob=float(log_probs[k]),
            )
            for k in range(len(ids))
        ]

    # --- scoring

    def score(self, sentences, targets, batch_size=None):
        """`Translator.score` through CTranslate2's ``score_batch``: the
        ``(score, log_prob)`` of each target as the translation of its
        sentence, teacher-forced."""
        sources, hypotheses = self._score_inputs(sentences, targets)
        config = self.generation_config
        outputs = self.engine.score_batch(
            [[self.source_tokens[t] for t in row] for row in sources],
            [[self.target_tokens[t] for t in row] for row in hypotheses],
            max_batch_size=batch_size or config.batch_size,
            max_input_length=0,
        )
        results = []
        for output in outputs:
            log_prob = float(np.sum(output.log_probs, dtype="float64"))
            # Every target token and the end token.
            penalty = keras.ops.convert_to_numpy(
                length_penalty(
                    np.asarray([len(output.log_probs)], "int32"),
                    config.length_penalty,
                    config.length_penalty_style,
                )
            )
            results.append((log_prob / float(penalty[0]), log_prob))
        return results


def _read_metadata(directory):
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{directory!r} is not a CTranslate2 export of keras-transformer "
            f"(no {METADATA_FILE}); write one with Translator.export("
            'directory, format="ctranslate2") or keras-transformer export '
            "--format ctranslate2."
        )
    metadata = read_json(path)
    version = (
        metadata.get("format_version") if isinstance(metadata, dict) else None
    )
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version={version!r}; this keras-transformer "
            f"({__version__}) reads format_version={FORMAT_VERSION}. Export "
            "the translator again."
        )
    return metadata


def _read_vocabularies(directory):
    """``(source tokens, target tokens)`` as CTranslate2 saved them."""
    shared = os.path.join(directory, "shared_vocabulary.json")
    if os.path.isfile(shared):
        tokens = read_json(shared)
        return tokens, tokens
    return (
        read_json(os.path.join(directory, "source_vocabulary.json")),
        read_json(os.path.join(directory, "target_vocabulary.json")),
    )


__all__ = [
    "CTranslate2Translator",
    "MissingDependencyError",
    "QUANTIZATIONS",
    "export_ctranslate2",
    "is_export",
    "transformer_spec",
]
