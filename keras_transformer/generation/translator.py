"""`Translator`: a trained `Transformer` and its tokenizer, turning
sentences into translations, saved and loaded as one directory."""

import dataclasses
import os

import keras
import numpy as np

from keras_transformer import hub, marian
from keras_transformer.generation.base import (
    BaseTranslator,
    Hypothesis,
    load_tokenizer_directory,
)
from keras_transformer.generation.config import GenerationConfig
from keras_transformer.generation.generator import Generator
from keras_transformer.generation.quantization import (
    QUANTIZATION_MODES,
    check_quantization_mode,
    quantization_mode,
    quantize_model,
    quantized_embeddings,
)
from keras_transformer.generation.search import (
    FINITE_SETTINGS,
    check_finite,
)
from keras_transformer.io_utils import read_json
from keras_transformer.models import Transformer
from keras_transformer.version import __version__

# Version 2 is KerasHub's preset layout (`keras_transformer.kerashub.
# presets.save_preset`); version 1 directories (config.json with a
# format_version, tokenizer/, generation_config.json) still load.
FORMAT_VERSION = 2
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_DIR = "tokenizer"
GENERATION_CONFIG_FILE = "generation_config.json"
METADATA_FILE = "metadata.json"
# This package's entry in KerasHub's metadata.json.
METADATA_KEY = "keras_transformer"
TASK_FILE = "task.json"
# The registered name of the backbone in a preset's config.json.
BACKBONE_NAME = "keras_transformer>TransformerBackbone"
# Where KerasHub's SentencePiece tokenizers keep their model file.
VOCABULARY_ASSET = os.path.join("assets", "tokenizer", "vocabulary.spm")
# `Translator.export`'s formats: a TensorFlow SavedModel, a CTranslate2
# model directory.
EXPORT_FORMATS = ("savedmodel", "ctranslate2")


@dataclasses.dataclass
class SentenceAttention:
    """The attention weights of one translated sentence, cropped to its
    real tokens (see `Translator.attention`).

    Attributes:
        source: the source sentence.
        translation: the target text the weights were computed on.
        source_tokens: the encoder's tokens: the source's subword pieces
            and the end token.
        target_tokens: the decoder's input tokens: the start token and
            the translation's pieces.
        output_tokens: what each decoder position predicts: the
            translation's pieces and the end token.
        encoder_self_attention: ``(layers, heads, source, source)``.
        decoder_self_attention: ``(layers, heads, target, target)``.
        cross_attention: ``(layers, heads, target, source)``.

    Axes are (query, key); float32 numpy arrays whose rows sum to 1.
    """

    source: str
    translation: str
    source_tokens: list
    target_tokens: list
    output_tokens: list
    encoder_self_attention: np.ndarray
    decoder_self_attention: np.ndarray
    cross_attention: np.ndarray


class Translator(BaseTranslator):
    """Translates sentences with a trained `Transformer` and tokenizer.

    Sentences are tokenized, given the end token (the encoder input of the
    training pipeline), sorted by length and decoded in batches with a
    cached, compiled search (`Generator`); translations come back in the
    input order. A progress bar shows on inputs of more than one batch.

    Inputs the model cannot take are handled explicitly: an empty (or
    all-whitespace) sentence translates to ``""`` without running the
    model; a sentence longer than the model's ``max_sequence_length - 1``
    subword tokens is truncated with a warning (or rejected with
    ``long_inputs="error"``); anything but a str raises `TypeError`.

    Args:
        model: a trained `keras_transformer.Transformer`.
        tokenizer: a `keras_transformer.data.SubwordTokenizer` (or any
            object with ``tokenize``, ``detokenize`` and the special ids).
            Sentences go through its ``encode`` where it has one, which
            gives Python lists without TensorFlow.
        generation_config: a `GenerationConfig`; keyword arguments
            override its settings.

    Example:
    >>> translator = Translator(model, tokenizer, beam_size=4)
    >>> translator.translate(["A man rides a bike."])
    ['Ein Mann fährt Fahrrad.']
    >>> translator.save("out/translator")
    >>> translator = Translator.from_pretrained("out/translator")
    """

    def __init__(self, model, tokenizer, generation_config=None, **settings):
        self.model = model
        self.tokenizer = tokenizer
        config = generation_config or GenerationConfig()
        self.generation_config = config.replace(**settings)
        model_vocabulary = model.target_vocabulary_size or model.vocabulary_size
        if tokenizer.vocabulary_size > model_vocabulary:
            raise ValueError(
                f"The tokenizer has {tokenizer.vocabulary_size} ids but the "
                f"model's vocabulary_size is {model_vocabulary}. Use the "
                "tokenizer the model was trained with."
            )
        self.generator = self._make_generator()

    @property
    def max_sequence_length(self):
        """The longest source or target the model accepts."""
        return self.model.max_sequence_length

    def _make_generator(self):
        return Generator(
            self.model,
            start_id=self.tokenizer.start_id,
            end_id=self.tokenizer.end_id,
            pad_id=self.tokenizer.pad_id,
        )

    def _translate_batch(self, token_lists, config):
        end_id = self.tokenizer.end_id
        width = max(len(row) for row in token_lists) + 1
        ids = np.full((len(token_lists), width), self.tokenizer.pad_id)
        for i, row in enumerate(token_lists):
            ids[i, : len(row) + 1] = [*row, end_id]
        mask = np.zeros_like(ids)
        for i, row in enumerate(token_lists):
            mask[i, : len(row) + 1] = 1
        result = self.generator.generate(
            ids.astype("int32"),
            mask.astype("int32"),
            method=config.method,
            beam_size=config.beam_size,
            length_penalty=config.length_penalty,
            max_length=config.max_length,
            max_length_offset=config.max_length_offset,
            num_return_sequences=config.num_return_sequences,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            seed=config.seed,
            length_penalty_style=config.length_penalty_style,
            early_stopping=config.early_stopping,
            force_end_token=config.force_end_token,
            renormalize=config.renormalize,
        )
        sequences = result.sequences(end_id)
        flat = [tokens for row in sequences for tokens in row]
        texts = self.tokenizer.detokenize(flat) if flat else []
        if isinstance(texts, str):
            texts = [texts]
        n = config.num_return_sequences
        return [
            [
                Hypothesis(
                    text=texts[i * n + k],
                    token_ids=sequences[i][k],
                    score=float(result.scores[i, k]),
                    log_prob=float(result.log_probs[i, k]),
                )
                for k in range(n)
            ]
            for i in range(len(token_lists))
        ]

    # --- scoring

    def score(self, sentences, targets, batch_size=None):
        """The model's scores of given translations (teacher forcing).

        Args:
            sentences: a list of source str.
            targets: a list of target str, one per sentence.
            batch_size: sentences per forward pass (the generation
                config's by default).

        Returns:
            A list of ``(score, log_prob)`` float pairs: the
            length-normalized score with the generation config's length
            penalty, and the total log-probability of the target tokens
            and the end token.
        """
        sources, hypotheses = self._score_inputs(sentences, targets)
        config = self.generation_config
        batch_size = batch_size or config.batch_size
        results = []
        for begin in range(0, len(sources), batch_size):
            end = begin + batch_size
            ids, mask = self._pad(
                [*row, self.tokenizer.end_id] for row in sources[begin:end]
            )
            target_ids, _ = self._pad(
                [*row, self.tokenizer.end_id] for row in hypotheses[begin:end]
            )
            log_probs, _, scores = self.generator.score(
                ids,
                target_ids,
                mask,
                length_penalty=config.length_penalty,
                length_penalty_style=config.length_penalty_style,
            )
            results += [
                (float(s), float(p))
                for s, p in zip(scores, log_probs, strict=True)
            ]
        return results

    def _pad(self, rows):
        """``(ids, mask)`` int32 arrays of rows padded to the longest."""
        rows = list(rows)
        width = max(len(row) for row in rows)
        ids = np.full((len(rows), width), self.tokenizer.pad_id, "int32")
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return ids, mask

    # --- attention

    def attention(self, sentences, targets=None, **settings):
        """Attention weights of translations, per layer and head.

        Translates the sentences (or takes the given ``targets``), then
        runs the model teacher-forced on each source and target with
        `Transformer.attention_weights`, and crops the weights to the
        real tokens of each pair.

        Args:
            sentences: a str or a list of str.
            targets: None to translate, else the target text(s) to
                force-decode, as many as ``sentences``.
            **settings: `GenerationConfig` overrides for translating.

        Returns:
            A `SentenceAttention` for a str, a list of them for a list.
        """
        single = isinstance(sentences, str)
        sentences = self._check_sentences(sentences)
        config = self.generation_config.replace(**settings)
        if targets is None:
            hypotheses = self.translate_with_scores(
                sentences, verbose=False, **settings
            )
            targets = [row[0].text for row in hypotheses]
            target_ids = [list(row[0].token_ids) for row in hypotheses]
        else:
            if isinstance(targets, str) != single:
                raise TypeError(
                    "Pass targets like sentences: a str for a str, a list "
                    f"for a list; got {type(targets).__name__}."
                )
            targets = self._check_sentences(targets)
            if len(targets) != len(sentences):
                raise ValueError(
                    f"There are {len(sentences)} sentences but "
                    f"{len(targets)} targets; pass one target per sentence."
                )
            target_ids = self._tokenize(targets, config)
        source_ids = [[] for _ in sentences]
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        for i, row in zip(
            todo,
            self._tokenize([sentences[i] for i in todo], config),
            strict=True,
        ):
            source_ids[i] = row
        results = []
        for begin in range(0, len(sentences), config.batch_size):
            end = begin + config.batch_size
            results += self._attention_batch(
                sentences[begin:end],
                targets[begin:end],
                source_ids[begin:end],
                target_ids[begin:end],
            )
        return results[0] if single else results

    def _attention_batch(self, sentences, targets, source_ids, target_ids):
        tokenizer = self.tokenizer
        # Encoder: pieces + end; decoder: start + pieces (teacher forcing).
        sources = [[*row, tokenizer.end_id] for row in source_ids]
        inputs = [[tokenizer.start_id, *row] for row in target_ids]
        limit = self.model.max_sequence_length
        inputs = [row[:limit] for row in inputs]

        def pad(rows):
            # Widths rounded up to a multiple of 8, so that eager runs
            # (JAX compiles each op per shape) reuse their programs.
            width = min(-(-max(map(len, rows)) // 8) * 8, limit)
            ids = np.full((len(rows), width), tokenizer.pad_id)
            mask = np.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = row
                mask[i, : len(row)] = 1
            return ids.astype("int32"), mask.astype("int32")

        encoder_ids, encoder_mask = pad(sources)
        decoder_ids, decoder_mask = pad(inputs)
        _, weights = self.model.attention_weights(
            {
                "encoder_token_ids": encoder_ids,
                "encoder_padding_mask": encoder_mask,
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": decoder_mask,
            }
        )
        # (batch, layers, heads, query, key)
        weights = {
            name: np.stack(
                [keras.ops.convert_to_numpy(w) for w in tensors], axis=1
            )
            for name, tensors in weights.items()
        }
        results = []
        for i, (source, target) in enumerate(zip(sources, inputs, strict=True)):
            s, t = len(source), len(target)
            outputs = [*target[1:], tokenizer.end_id]
            encoder = weights["encoder_self_attention"][i, :, :, :s, :s]
            decoder = weights["decoder_self_attention"][i, :, :, :t, :t]
            cross = weights["cross_attention"][i, :, :, :t, :s]
            results.append(
                SentenceAttention(
                    source=sentences[i],
                    translation=targets[i],
                    source_tokens=self._pieces(source),
                    target_tokens=self._pieces(target),
                    output_tokens=self._pieces(outputs),
                    encoder_self_attention=encoder,
                    decoder_self_attention=decoder,
                    cross_attention=cross,
                )
            )
        return results

    def _pieces(self, ids):
        if hasattr(self.tokenizer, "id_to_token"):
            return [str(p) for p in self.tokenizer.id_to_token(list(ids))]
        return [str(i) for i in ids]

    # --- quantization

    @property
    def quantization_mode(self):
        """The quantization of the model's weights: None (float weights)
        or ``"int8"`` (see `quantize`)."""
        return quantization_mode(self.model)

    def quantize(self, mode):
        """Quantizes the model's weights in place with Keras's
        `keras.Model.quantize`, and returns this translator, so that
        ``Translator.from_pretrained(path).quantize("int8")`` reads as one
        step.

        ``"int8"``: the kernel of every ``Dense`` and ``EinsumDense``
        layer (the attention projections and the feed-forward networks)
        becomes int8 with a float32 scale per output unit, and their
        inputs are quantized to int8 per row as they arrive. The shared
        token embedding becomes int8 with a scale per token, as Keras's
        ``Embedding`` quantizes (`TokenEmbedding.quantize`), so the
        pre-softmax projection (section 3.4) is an int8 product too. The
        biases and layer norms stay float32. `save` records the mode, and
        `from_pretrained` loads the int8 weights as such (translators
        saved with a float32 embedding load as they were saved).

        As with Keras's ``quantize``, the float weights are gone
        afterwards (load the translator again for them), and the
        compiled searches of the float model are dropped.

        Args:
            mode: ``"int8"`` (`QUANTIZATION_MODES`).

        Raises:
            ValueError: another mode, or a model already quantized.
        """
        check_quantization_mode(mode)
        if self.quantization_mode is not None:
            raise ValueError(
                f"quantize(mode={mode!r}): this translator is already "
                f"quantized ({self.quantization_mode!r}). Quantize a float "
                "translator: load it again with Translator.from_pretrained."
            )
        quantize_model(self.model, mode)
        self.generator = self._make_generator()
        return self

    # --- saving

    def save(self, directory):
        """Writes the translator to a directory, without pickle, as a
        KerasHub preset: `from_pretrained` and
        ``keras_hub.models.Seq2SeqLM.from_preset`` (after ``import
        keras_transformer``) both load it, under any backend.

        The files: ``config.json`` (the `TransformerBackbone`),
        ``model.weights.h5``, ``task.json`` (with the generation
        settings), ``metadata.json`` (with this package's format version
        and quantization), and the tokenizer (``preprocessor.json``,
        ``tokenizer.json`` and ``assets/tokenizer/``; a Marian tokenizer
        in ``tokenizer/``). See
        `keras_transformer.kerashub.presets.save_preset`.
        """
        mode = self.quantization_mode
        if mode is not None:
            check_quantization_mode(
                mode,
                f"The model's weights are quantized as {mode!r}; a saved "
                f"translator holds float or {QUANTIZATION_MODES} weights. "
                'Quantize a float translator with quantize("int8").',
            )
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        # Files of an earlier save that this one does not rewrite: a
        # manifest (it would describe the old files and make the next load
        # refuse the new ones) and the version 1 generation settings (now
        # in task.json). A training run's tokenizer/ stays: it resumes
        # from it.
        for name in ("manifest.json", GENERATION_CONFIG_FILE):
            path = os.path.join(directory, name)
            if os.path.exists(path):
                os.remove(path)
        # Imported here: KerasHub imports TensorFlow, which loading and
        # translating on JAX or torch do without.
        from keras_transformer.kerashub.presets import save_preset

        metadata = {
            "format_version": FORMAT_VERSION,
            "version": __version__,
            "quantization": mode,
            # Translators saved before the token embedding quantized
            # (without this key) hold it in float32.
            "quantized_embeddings": quantized_embeddings(self.model),
            "tokenizer_config": getattr(self.tokenizer, "config", None),
        }
        wrote_tokenizer = save_preset(
            self.model,
            self.tokenizer,
            self.generation_config.to_dict(),
            directory,
            {METADATA_KEY: metadata},
        )
        if not wrote_tokenizer:
            # A Marian tokenizer (two SentencePiece models and a
            # vocabulary) has no KerasHub counterpart.
            self.tokenizer.save(os.path.join(directory, TOKENIZER_DIR))

    def export(
        self, directory, overwrite=False, format="savedmodel", quantization=None
    ):
        """Writes the translator for serving, in one of two formats.

        ``format="savedmodel"`` (the default): a TensorFlow SavedModel
        whose ``serving_default`` signature takes a batch of
        ``tf.string`` sentences and returns their translations and
        scores, with tokenization, the cached search of this
        translator's generation settings and detokenization in the
        graph. It loads with ``tf.saved_model.load`` where only
        ``tensorflow`` and ``tensorflow-text`` are installed (TF
        Serving). See `keras_transformer.export.export_translator`.

        ``format="ctranslate2"``: a CTranslate2 model directory, written
        by CTranslate2's converter API, with the tokenizer and the
        generation settings beside it, for fast CPU decoding with
        `keras_transformer.ctranslate2_engine.CTranslate2Translator` or
        ``keras-transformer translate --engine ctranslate2``. Needs
        ``pip install "keras-transformer[ctranslate2]"``. See
        `keras_transformer.ctranslate2_engine.export_ctranslate2`.

        Args:
            directory: the directory to write.
            overwrite: replace a non-empty ``directory``; without it a
                non-empty directory is refused before any work.
            format: ``"savedmodel"`` or ``"ctranslate2"``.
            quantization: ``"ctranslate2"`` only: CTranslate2's stored
                weight type (``"int8"``, ``"int8_float32"``,
                ``"int16"``, ``"float16"``, ``"bfloat16"``, ...); by
                default float32, or int8 for an int8 translator.
        """
        if format not in EXPORT_FORMATS:
            raise ValueError(
                f"format={format!r} is not one of {EXPORT_FORMATS}."
            )
        directory = os.fspath(directory)
        if format == "ctranslate2":
            from keras_transformer import ctranslate2_engine

            ctranslate2_engine.require_ctranslate2()
            ctranslate2_engine.check_quantization(quantization)
            check_export_directory(directory, overwrite)
            return ctranslate2_engine.export_ctranslate2(
                self, directory, quantization
            )
        if quantization is not None:
            raise ValueError(
                f"quantization={quantization!r} applies to "
                'format="ctranslate2"; for a SavedModel, quantize the '
                'translator first: translator.quantize("int8").'
            )
        check_export_directory(directory, overwrite)
        # TensorFlow is imported only when exporting: translating on
        # JAX or torch does not need it.
        from keras_transformer.export import export_translator

        return export_translator(self, directory)

    def push_to_hub(self, repo_id, **options):
        """Uploads the translator to the Hugging Face Hub in one commit,
        with a model card and a manifest of checksums; returns the commit
        id. See `keras_transformer.hub.push_to_hub` for the ``options``
        (``revision``, ``commit_message``, ``private``, ``create_pr``,
        ``token``, ``results``, ``card``, ``tag``).

        Example:
        >>> translator.push_to_hub("me/en-de", results="runs/multi30k")
        >>> Translator.from_pretrained("hf://me/en-de")
        """
        return hub.push_to_hub(self, repo_id, **options)

    @classmethod
    def from_pretrained(
        cls,
        directory,
        revision=None,
        token=None,
        local_files_only=False,
        **settings,
    ):
        """Loads a translator written by `save` or `push_to_hub`, or
        converts a Hugging Face Marian (OPUS-MT) checkpoint
        (`keras_transformer.marian.load_checkpoint`).

        Args:
            directory: the saved translator's directory, or a Hub
                repository: ``"hf://owner/name"``, pinned with
                ``"hf://owner/name@revision"`` or ``revision``.
            revision: a branch, tag or commit id (Hub repositories).
            token: a Hub token, for private repositories.
            local_files_only: load from the Hugging Face cache only.
            **settings: generation settings overriding the saved ones.
        """
        # Settings refused whatever the saved ones are, before the
        # (possibly long) download and load.
        for name in FINITE_SETTINGS:
            check_finite(name, settings.get(name))
        # A Hub reference becomes a verified snapshot directory in the
        # Hugging Face cache; from here on, everything reads a directory.
        directory = hub.resolve_directory(
            directory, revision, token, local_files_only
        )
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"No translator directory at {directory!r}; expected one "
                "written by Translator.save(directory)."
            )
        if marian.is_marian_directory(directory):
            # A Hugging Face Marian (OPUS-MT) checkpoint, converted.
            model, tokenizer, generation = marian.load_checkpoint(directory)
            generation = GenerationConfig.from_dict(generation)
        else:
            model, tokenizer, generation = _load_directory(directory)
        return cls(model, tokenizer, generation, **settings)


def _load_directory(directory):
    """``(model, tokenizer, generation_config)`` of a directory written by
    `Translator.save` (a KerasHub preset, or the layout of version 1) or
    by ``TransformerSeq2SeqLM.save_to_preset``."""
    config = _read_config(directory)
    if "format_version" in config:
        return _load_version_1(directory, config)
    return _load_preset(directory, config)


def _read_config(directory):
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{directory!r} has no {CONFIG_FILE}; expected a translator "
            "written by Translator.save(directory) or a KerasHub preset of "
            "a TransformerSeq2SeqLM."
        )
    config = read_json(path)
    if not isinstance(config, dict):
        raise ValueError(
            f"{path} holds a JSON {type(config).__name__}, not an object; "
            "re-save or re-download the translator."
        )
    return config


def _load_preset(directory, config):
    """Loads KerasHub's preset layout without importing KerasHub (which
    imports TensorFlow): the backbone's config builds a `Transformer`, the
    same weights file loads into it."""
    registered = config.get("registered_name") or config.get("class_name")
    if registered != BACKBONE_NAME or not isinstance(
        config.get("config"), dict
    ):
        raise ValueError(
            f"{os.path.join(directory, CONFIG_FILE)} holds a "
            f"{registered or 'config'} preset, not a {BACKBONE_NAME}; "
            "Translator loads presets saved by keras_transformer "
            "(Translator.save, TransformerSeq2SeqLM.save_to_preset)."
        )
    if not os.path.isfile(os.path.join(directory, WEIGHTS_FILE)):
        raise FileNotFoundError(
            f"{directory!r} has no {WEIGHTS_FILE}; save the translator "
            "again with Translator.save(directory)."
        )
    info = _read_metadata(directory)
    version = info.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{METADATA_FILE} in {directory!r} has format_version="
            f"{version!r}; this keras-transformer ({__version__}) reads "
            f"format_version={FORMAT_VERSION} and 1. Upgrade "
            "keras-transformer, or save it again."
        )
    model = _model_with_weights(
        directory,
        config["config"],
        info.get("quantization"),
        METADATA_FILE,
        embeddings=info.get("quantized_embeddings", False),
    )
    task = _read_task(directory)
    generation = _generation_config(
        os.path.join(directory, TASK_FILE),
        task.get("generation_config") or {},
    )
    return model, _preset_tokenizer(directory, task, info), generation


def _read_metadata(directory):
    """This package's entry of ``metadata.json`` ({} for a preset that
    KerasHub wrote alone)."""
    path = os.path.join(directory, METADATA_FILE)
    metadata = read_json(path) if os.path.isfile(path) else {}
    info = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else {}
    return info if isinstance(info, dict) else {}


def _read_task(directory):
    path = os.path.join(directory, TASK_FILE)
    if not os.path.isfile(path):
        return {}
    task = read_json(path)
    config = task.get("config") if isinstance(task, dict) else None
    if not isinstance(config, dict):
        raise ValueError(
            f"{path} is not a KerasHub task config (a JSON object with a "
            "config object); re-save or re-download the translator."
        )
    return config


def _preset_tokenizer(directory, task, info):
    """The tokenizer of a preset: KerasHub's SentencePiece asset when the
    task has a preprocessor, else the ``tokenizer/`` directory (Marian)."""
    vocabulary = os.path.join(directory, VOCABULARY_ASSET)
    if task.get("preprocessor") and os.path.isfile(vocabulary):
        # Imported here: `generation` does not depend on `data` otherwise.
        from keras_transformer.data.tokenizer import read_model_file

        return read_model_file(vocabulary, info.get("tokenizer_config"))
    if os.path.isdir(os.path.join(directory, TOKENIZER_DIR)):
        return load_tokenizer_directory(os.path.join(directory, TOKENIZER_DIR))
    raise FileNotFoundError(
        f"{directory!r} has no tokenizer ({VOCABULARY_ASSET} with a "
        f"preprocessor in {TASK_FILE}, or {TOKENIZER_DIR}/); save the "
        "translator with Translator.save, or the task with its "
        "preprocessor."
    )


def _load_version_1(directory, config):
    """The layout that `Translator.save` wrote before KerasHub's:
    ``config.json`` with a format version, ``model.weights.h5``,
    ``tokenizer/`` and ``generation_config.json``."""
    expected = (CONFIG_FILE, WEIGHTS_FILE, GENERATION_CONFIG_FILE)
    for name in expected + (TOKENIZER_DIR,):
        if not os.path.exists(os.path.join(directory, name)):
            raise FileNotFoundError(
                f"{directory!r} has no {name}; a saved translator holds "
                f"{list(expected)} and {TOKENIZER_DIR}/. Save it again "
                "with Translator.save(directory)."
            )
    if not isinstance(config.get("model_config"), dict):
        raise ValueError(
            f"{os.path.join(directory, CONFIG_FILE)} is not a translator's "
            "config (a JSON object with a model_config object); re-save "
            "or re-download the translator."
        )
    version = config.get("format_version")
    if version != 1:
        raise ValueError(
            f"{CONFIG_FILE} in {directory!r} has format_version="
            f"{version!r}; this keras-transformer ({__version__}) reads "
            f"format_version={FORMAT_VERSION} and 1. Use the version that "
            "saved it, or save it again."
        )
    if config.get("model_class") != "Transformer":
        raise ValueError(
            f"{CONFIG_FILE} in {directory!r} describes a "
            f"{config.get('model_class')!r}, not a Transformer."
        )
    # Directories without the key hold float weights.
    model = _model_with_weights(
        directory,
        config["model_config"],
        config.get("quantization"),
        CONFIG_FILE,
    )
    tokenizer = load_tokenizer_directory(os.path.join(directory, TOKENIZER_DIR))
    path = os.path.join(directory, GENERATION_CONFIG_FILE)
    return model, tokenizer, _generation_config(path, read_json(path))


def _model_with_weights(
    directory, model_config, quantization, source, embeddings=False
):
    """The `Transformer` of a saved config, quantized as recorded in
    ``source`` (None: float; ``embeddings``: the token embedding too),
    with the saved weights."""
    if quantization is not None:
        check_quantization_mode(
            quantization,
            f"{source} in {directory!r} has quantization="
            f"{quantization!r}; this keras-transformer ({__version__}) "
            f"loads {QUANTIZATION_MODES}. Upgrade keras-transformer.",
        )
    try:
        model = Transformer.from_config(model_config)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The model config in {os.path.join(directory, CONFIG_FILE)} "
            f"does not build a Transformer: {error}; re-save or "
            "re-download the translator."
        ) from error
    if quantization is not None:
        # The int8 variables are made by quantizing the new float model;
        # loading then replaces their values with the saved ones.
        quantize_model(model, quantization, embeddings=embeddings)
    model.load_weights(os.path.join(directory, WEIGHTS_FILE))
    return model


def _generation_config(path, settings):
    """A `GenerationConfig` from the settings read from ``path``."""
    if not isinstance(settings, dict):
        raise ValueError(
            f"{path} holds a JSON {type(settings).__name__}, not an object "
            "of generation settings; re-save or re-download the translator."
        )
    try:
        return GenerationConfig.from_dict(settings)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{path}: {error} Re-save or re-download the translator."
        ) from error


def check_export_directory(directory, overwrite=False):
    """Raises a `FileExistsError` for a ``directory`` that an export
    would replace without ``overwrite``: a non-empty directory, or a
    file (always)."""
    directory = os.fspath(directory)
    if os.path.isdir(directory) and os.listdir(directory):
        if not overwrite:
            raise FileExistsError(
                f"{directory!r} exists and is not empty; pass "
                "overwrite=True (--overwrite) or another directory."
            )
    elif os.path.exists(directory):
        raise FileExistsError(
            f"{directory!r} is a file, not a directory; pass another directory."
        )
