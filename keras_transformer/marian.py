"""Hugging Face Marian (OPUS-MT) checkpoints as keras-transformer models.

More than a thousand translation models on the Hugging Face Hub
(``Helsinki-NLP/opus-mt-*``) are Marian models: the Transformer of the
paper with a few options, all of which are `Transformer` settings here:
a swish feed-forward activation, embeddings scaled by sqrt(d_model),
sine/cosine position encodings in two halves
(``position_encoding_layout="concatenated"``, positions from 0), post-norm
layers, LayerNorm epsilon 1e-5, one embedding matrix for source, target
and output (or separate source and target vocabularies) and a bias on the
logits (``use_output_bias=True``).

`load_checkpoint(directory)` converts a checkpoint directory
(``config.json`` with ``model_type: marian``, ``model.safetensors`` or
``pytorch_model.bin``, ``source.spm``, ``target.spm``, ``vocab.json``,
optionally ``generation_config.json``) into a `Transformer`, a tokenizer
that gives the ids of ``transformers``' ``MarianTokenizer``, and the
decoding settings that reproduce ``transformers``' ``generate``.
`Translator.from_pretrained` composes them into a translator for such a
directory, or for ``"hf://Helsinki-NLP/opus-mt-en-de"``.

Neither ``torch`` nor ``transformers`` is needed for a safetensors
checkpoint; a ``pytorch_model.bin`` is read with ``torch``.

Example:
>>> translator = kt.Translator.from_pretrained(
...     "hf://Helsinki-NLP/opus-mt-en-de")
>>> translator.translate("A man rides a bike.")
>>> translator.save("opus-mt-en-de")  # our format; any backend loads it
"""

import os

import numpy as np

from keras_transformer.io_utils import read_json, write_json
from keras_transformer.models import Transformer

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
SOURCE_SPM = "source.spm"
TARGET_SPM = "target.spm"
VOCAB_FILE = "vocab.json"
TARGET_VOCAB_FILE = "target_vocab.json"
TOKENIZER_CONFIG_FILE = "marian_tokenizer.json"
_TOKENIZER_FORMAT_VERSION = 1

# transformers' activation names -> Keras activations (same functions).
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "swish": "silu",
    "silu": "silu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
}
_SPIECE_UNDERLINE = "\u2581"


# --- detection


def is_marian_directory(directory):
    """Whether ``directory`` holds a Hugging Face Marian checkpoint: a
    ``config.json`` with ``model_type == "marian"`` and no keras-transformer
    ``format_version``."""
    path = os.path.join(os.fspath(directory), CONFIG_FILE)
    if not os.path.isfile(path):
        return False
    try:
        config = read_json(path)
    except (OSError, ValueError):
        return False
    return (
        isinstance(config, dict)
        and "format_version" not in config
        and config.get("model_type") == "marian"
    )


def is_marian_tokenizer_directory(directory):
    """Whether ``directory`` holds a `MarianTokenizer` written by
    `MarianTokenizer.save`."""
    return os.path.isfile(os.path.join(directory, TOKENIZER_CONFIG_FILE))


# --- the tokenizer


class MarianTokenizer:
    """The tokenizer of a Marian model, with ``transformers``' ids.

    Text is split into pieces by the source SentencePiece model
    (``source.spm``) and the pieces are mapped to ids through
    ``vocab.json`` (pieces missing from it become the unknown id), as
    ``transformers.MarianTokenizer`` does; a leading language code such as
    ``>>fra<<`` (multilingual models) is kept as one token. Ids map back
    to pieces through the target vocabulary and the target SentencePiece
    model joins them, special tokens (end, padding, unknown) removed, like
    ``batch_decode(ids, skip_special_tokens=True)``.

    Unlike ``transformers``, no Moses punctuation normalization is applied
    (``transformers`` applies it only when ``sacremoses`` is installed).

    It has the interface `Translator` needs: ``tokenize``,
    ``detokenize``, ``vocabulary_size``, ``pad_id``, ``start_id``
    (Marian decoders start from the padding id), ``end_id``, ``save``;
    `load_marian_tokenizer` reads a saved one back.

    Args:
        source_spm, target_spm: the SentencePiece models, as bytes.
        vocab: dict piece -> id (``vocab.json``).
        target_vocab: a separate target vocabulary
            (``target_vocab.json``), or None when it is ``vocab``.
        unk_token, eos_token, pad_token: the special pieces.
        decoder_start_id: the first decoder input; by default the padding
            id, as in every Marian model.
    """

    def __init__(
        self,
        source_spm,
        target_spm,
        vocab,
        target_vocab=None,
        unk_token="<unk>",
        eos_token="</s>",
        pad_token="<pad>",
        decoder_start_id=None,
    ):
        import sentencepiece

        self.source_spm = bytes(source_spm)
        self.target_spm = bytes(target_spm)
        self.vocab = {str(k): int(v) for k, v in vocab.items()}
        self.target_vocab = (
            None
            if target_vocab is None
            else {str(k): int(v) for k, v in target_vocab.items()}
        )
        self.unk_token = unk_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        for name, token in (
            ("unk_token", unk_token),
            ("eos_token", eos_token),
            ("pad_token", pad_token),
        ):
            if token not in self.vocab:
                raise ValueError(
                    f"{name}={token!r} is not in the vocabulary ({VOCAB_FILE} "
                    f"has {len(self.vocab)} entries). Check that the files "
                    "belong to one Marian model."
                )
        self.unk_id = self.vocab[unk_token]
        self.end_id = self.vocab[eos_token]
        self.pad_id = self.vocab[pad_token]
        self.start_id = (
            self.pad_id if decoder_start_id is None else int(decoder_start_id)
        )
        self._source = sentencepiece.SentencePieceProcessor()
        self._source.LoadFromSerializedProto(self.source_spm)
        self._target = sentencepiece.SentencePieceProcessor()
        self._target.LoadFromSerializedProto(self.target_spm)
        decoder_vocab = self.target_vocab or self.vocab
        self._pieces = {i: piece for piece, i in decoder_vocab.items()}
        target_specials = (eos_token, pad_token, unk_token)
        self._special_ids = {
            decoder_vocab[t] for t in target_specials if t in decoder_vocab
        }
        self._language_codes = {
            k for k in self.vocab if k.startswith(">>") and k.endswith("<<")
        }

    @property
    def vocabulary_size(self):
        """Number of target ids (the size of the model's output)."""
        return len(self.target_vocab or self.vocab)

    def _tokenize_one(self, text, spm, vocab):
        if not isinstance(text, str):
            raise TypeError(
                f"MarianTokenizer.tokenize expects str; got "
                f"{type(text).__name__}: {text!r}."
            )
        code = []
        if text.startswith(">>"):
            end = text.find("<<")
            if end != -1:
                code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + spm.encode(text, out_type=str)
        return [vocab.get(piece, self.unk_id) for piece in pieces]

    def tokenize(self, inputs):
        """Ids of a str (a list) or of a list of str (a list of lists),
        without the end token."""
        if isinstance(inputs, str):
            return self._tokenize_one(inputs, self._source, self.vocab)
        return [
            self._tokenize_one(text, self._source, self.vocab)
            for text in inputs
        ]

    def tokenize_target(self, inputs):
        """Ids of target-language text, as `tokenize` gives them for the
        source: split by the target SentencePiece model and mapped
        through the target vocabulary, like ``transformers``'
        ``tokenizer(text_target=...)``. They are the labels when the
        model is trained further."""
        vocab = self.target_vocab or self.vocab
        if isinstance(inputs, str):
            return self._tokenize_one(inputs, self._target, vocab)
        return [
            self._tokenize_one(text, self._target, vocab) for text in inputs
        ]

    def _detokenize_one(self, ids):
        pieces = []
        for i in ids:
            i = int(i)
            if i in self._special_ids:
                continue
            piece = self._pieces.get(i)
            if piece is None:
                piece = (
                    self._target.IdToPiece(i) if i < len(self._target) else ""
                )
            pieces.append(piece)
        text = self._target.decode_pieces(pieces)
        return text.replace(_SPIECE_UNDERLINE, " ").strip()

    def detokenize(self, ids):
        """Text of a list of ids (a str) or of a list of lists (a list of
        str); end, padding and unknown ids are dropped."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        if len(ids) and not isinstance(ids[0], (list, tuple)):
            return self._detokenize_one(ids)
        return [self._detokenize_one(row) for row in ids]

    def save(self, directory):
        """Writes ``source.spm``, ``target.spm``, ``vocab.json`` (and
        ``target_vocab.json``) and ``marian_tokenizer.json``."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        for name, data in (
            (SOURCE_SPM, self.source_spm),
            (TARGET_SPM, self.target_spm),
        ):
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        _write_tokenizer_json(os.path.join(directory, VOCAB_FILE), self.vocab)
        if self.target_vocab is not None:
            _write_tokenizer_json(
                os.path.join(directory, TARGET_VOCAB_FILE), self.target_vocab
            )
        _write_tokenizer_json(
            os.path.join(directory, TOKENIZER_CONFIG_FILE),
            {
                "format_version": _TOKENIZER_FORMAT_VERSION,
                "class": "MarianTokenizer",
                "unk_token": self.unk_token,
                "eos_token": self.eos_token,
                "pad_token": self.pad_token,
                "decoder_start_id": self.start_id,
                "separate_vocabs": self.target_vocab is not None,
            },
        )

    def __repr__(self):
        return (
            f"MarianTokenizer(vocabulary_size={self.vocabulary_size}, "
            f"pad_id={self.pad_id}, end_id={self.end_id})"
        )


def _write_tokenizer_json(path, data):
    # In the layout of transformers' files: vocabulary order, pieces
    # unescaped.
    write_json(path, data, sort_keys=False, ensure_ascii=False)


def _read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def _require(directory, names, what):
    for name in names:
        if not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(
                f"{directory!r} has no {name}; {what} needs {', '.join(names)}."
            )


def load_marian_tokenizer(directory, **overrides):
    """A `MarianTokenizer` from a Hugging Face Marian checkpoint directory
    (``source.spm``, ``target.spm``, ``vocab.json``, optionally
    ``target_vocab.json`` and ``tokenizer_config.json``) or from a
    directory written by `MarianTokenizer.save`."""
    directory = os.fspath(directory)
    _require(
        directory, (SOURCE_SPM, TARGET_SPM, VOCAB_FILE), "a Marian tokenizer"
    )
    options = {}
    ours = os.path.join(directory, TOKENIZER_CONFIG_FILE)
    theirs = os.path.join(directory, "tokenizer_config.json")
    separate = False
    if os.path.isfile(ours):
        config = read_json(ours)
        version = config.get("format_version")
        if version != _TOKENIZER_FORMAT_VERSION:
            raise ValueError(
                f"{ours} has format_version={version!r}; this version of "
                f"keras-transformer reads {_TOKENIZER_FORMAT_VERSION}."
            )
        separate = config.get("separate_vocabs", False)
        for key in ("unk_token", "eos_token", "pad_token", "decoder_start_id"):
            if key in config:
                options[key] = config[key]
    elif os.path.isfile(theirs):
        config = read_json(theirs)
        separate = bool(config.get("separate_vocabs", False))
        for key in ("unk_token", "eos_token", "pad_token"):
            value = config.get(key)
            if isinstance(value, dict):  # an AddedToken
                value = value.get("content")
            if isinstance(value, str):
                options[key] = value
    options.update(overrides)
    target_vocab = None
    if separate:
        _require(directory, (TARGET_VOCAB_FILE,), "separate_vocabs")
        target_vocab = read_json(os.path.join(directory, TARGET_VOCAB_FILE))
    return MarianTokenizer(
        _read_bytes(os.path.join(directory, SOURCE_SPM)),
        _read_bytes(os.path.join(directory, TARGET_SPM)),
        read_json(os.path.join(directory, VOCAB_FILE)),
        target_vocab=target_vocab,
        **options,
    )


# --- the weights


def _unreadable(path, error):
    """A one-line ValueError naming a weights file that cannot be read."""
    reason = " ".join(str(error).split()) or type(error).__name__
    return ValueError(
        f"{path} cannot be read as a checkpoint ({reason}); the file is "
        "truncated or corrupt: download it again."
    )


def read_state_dict(directory):
    """The checkpoint's tensors as a dict name -> NumPy array, from
    ``model.safetensors`` (no torch needed) or ``pytorch_model.bin``
    (read with ``torch.load(weights_only=True)``)."""
    directory = os.fspath(directory)
    safetensors_path = os.path.join(directory, SAFETENSORS_FILE)
    pytorch_path = os.path.join(directory, PYTORCH_FILE)
    if os.path.isfile(safetensors_path):
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return dict(load_file(safetensors_path))
        except (SafetensorError, OSError) as error:
            # Without the file's name otherwise.
            raise _unreadable(safetensors_path, error) from error
    if os.path.isfile(pytorch_path):
        try:
            import torch
        except ImportError as error:
            raise ImportError(
                f"{pytorch_path} is a PyTorch checkpoint and reading it "
                "needs torch, which is not installed. Install torch (pip "
                "install torch), or convert the checkpoint to "
                f"{SAFETENSORS_FILE}."
            ) from error
        try:
            state = torch.load(
                pytorch_path, map_location="cpu", weights_only=True
            )
        except (OSError, RuntimeError, EOFError) as error:
            # A truncated archive ("PytorchStreamReader failed reading zip
            # archive"), without the file's name. Refusals of unsafe
            # pickles (weights_only, an UnpicklingError) pass unchanged.
            raise _unreadable(pytorch_path, error) from error
        return {
            name: tensor.detach().to(torch.float32).numpy()
            if tensor.is_floating_point()
            else tensor.numpy()
            for name, tensor in state.items()
        }
    raise FileNotFoundError(
        f"{directory!r} has neither {SAFETENSORS_FILE} nor {PYTORCH_FILE}; "
        "a Marian checkpoint needs one of them."
    )


class _Weights:
    """Looks tensors up by name, with or without the ``model.`` prefix,
    and remembers which were used."""

    def __init__(self, state):
        self.state = {
            name.removeprefix("model."): np.asarray(value, "float32")
            for name, value in state.items()
        }
        self.used = set()

    def get(self, *names):
        for name in names:
            if name in self.state:
                self.used.add(name)
                return self.state[name]
        raise KeyError(
            f"The checkpoint has none of {list(names)}; it has "
            f"{len(self.state)} tensors, e.g. {sorted(self.state)[:5]}."
        )

    def has(self, name):
        return name in self.state


def model_options(config):
    """`Transformer` keyword arguments for a ``MarianConfig`` dict."""
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"activation_function={activation!r} has no Keras equivalent "
            f"here; supported: {sorted(ACTIVATIONS)}."
        )
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(encoder_key) != config.get(decoder_key):
            raise ValueError(
                f"{encoder_key}={config.get(encoder_key)} differs from "
                f"{decoder_key}={config.get(decoder_key)}; keras-transformer "
                "uses one value for both stacks."
            )
    if config.get("normalize_before") or config.get("add_final_layer_norm"):
        normalize_first = bool(config.get("normalize_before"))
        if normalize_first != bool(config.get("add_final_layer_norm")):
            raise ValueError(
                "normalize_before and add_final_layer_norm differ in "
                "config.json; keras-transformer supports pre-norm with a "
                "final LayerNorm or post-norm without."
            )
    else:
        normalize_first = False
    vocabulary_size = int(config["vocab_size"])
    shared = config.get("share_encoder_decoder_embeddings", True)
    target_size = None
    if not shared:
        target_size = int(config.get("decoder_vocab_size") or vocabulary_size)
    return {
        "vocabulary_size": vocabulary_size,
        "target_vocabulary_size": target_size,
        "num_encoder_layers": int(config["encoder_layers"]),
        "num_decoder_layers": int(config["decoder_layers"]),
        "hidden_dim": int(config["d_model"]),
        "num_heads": int(config["encoder_attention_heads"]),
        "intermediate_dim": int(config["encoder_ffn_dim"]),
        "dropout": float(config.get("dropout", 0.1)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "activation_dropout": float(config.get("activation_dropout", 0.0)),
        "activation": ACTIVATIONS[activation],
        "max_sequence_length": int(config.get("max_position_embeddings", 512)),
        "normalize_first": normalize_first,
        "layer_norm_epsilon": 1e-5,
        "share_embeddings": bool(shared),
        "tie_output_embeddings": bool(config.get("tie_word_embeddings", True)),
        "scale_embeddings": bool(config.get("scale_embedding", False)),
        "position_encoding_layout": "concatenated",
        "use_output_bias": True,
    }


def _assign(variable, value):
    value = np.asarray(value, "float32")
    if tuple(variable.shape) != value.shape:
        raise ValueError(
            f"{variable.path}: the checkpoint's tensor has shape "
            f"{value.shape}, the model expects {tuple(variable.shape)}."
        )
    variable.assign(value)


def _set_dense(layer, weights, prefix, num_heads=None, kind="dense"):
    """A torch Linear ``(out, in)`` into a Keras (Einsum)Dense."""
    kernel = weights.get(f"{prefix}.weight").T  # (in, out)
    bias = weights.get(f"{prefix}.bias")
    if kind == "in":  # (d, heads, head_dim)
        kernel = kernel.reshape(kernel.shape[0], num_heads, -1)
        bias = bias.reshape(num_heads, -1)
    elif kind == "out":  # (heads, head_dim, d)
        kernel = kernel.reshape(num_heads, -1, kernel.shape[-1])
    _assign(layer.kernel, kernel)
    _assign(layer.bias, bias)


def _set_norm(layer, weights, prefix):
    _assign(layer.gamma, weights.get(f"{prefix}.weight"))
    _assign(layer.beta, weights.get(f"{prefix}.bias"))


def _set_attention(layer, weights, prefix, num_heads):
    _set_dense(layer.query_dense, weights, f"{prefix}.q_proj", num_heads, "in")
    _set_dense(layer.key_dense, weights, f"{prefix}.k_proj", num_heads, "in")
    _set_dense(layer.value_dense, weights, f"{prefix}.v_proj", num_heads, "in")
    _set_dense(
        layer.output_dense, weights, f"{prefix}.out_proj", num_heads, "out"
    )


def _set_feed_forward(layer, weights, prefix):
    _set_dense(layer.intermediate_dense, weights, f"{prefix}.fc1")
    _set_dense(layer.output_dense, weights, f"{prefix}.fc2")


def convert_weights(model, state):
    """Copies a Marian state dict (name -> array) into a `Transformer`
    built with `model_options`. Returns the names of unused tensors."""
    weights = _Weights(state)
    heads = model.num_heads
    shared = model.encoder_token_embedding is model.decoder_token_embedding
    if shared:
        matrix = weights.get(
            "shared.weight",
            "encoder.embed_tokens.weight",
            "decoder.embed_tokens.weight",
        )
        _assign(model.encoder_token_embedding.embeddings, matrix)
    else:
        _assign(
            model.encoder_token_embedding.embeddings,
            weights.get("encoder.embed_tokens.weight", "shared.weight"),
        )
        _assign(
            model.decoder_token_embedding.embeddings,
            weights.get("decoder.embed_tokens.weight"),
        )
    for i, layer in enumerate(model.encoder_layers):
        prefix = f"encoder.layers.{i}"
        _set_attention(
            layer.self_attention, weights, f"{prefix}.self_attn", heads
        )
        _set_norm(
            layer.self_attention_norm, weights, f"{prefix}.self_attn_layer_norm"
        )
        _set_feed_forward(layer.feed_forward, weights, prefix)
        _set_norm(
            layer.feed_forward_norm, weights, f"{prefix}.final_layer_norm"
        )
    for i, layer in enumerate(model.decoder_layers):
        prefix = f"decoder.layers.{i}"
        _set_attention(
            layer.self_attention, weights, f"{prefix}.self_attn", heads
        )
        _set_norm(
            layer.self_attention_norm, weights, f"{prefix}.self_attn_layer_norm"
        )
        _set_attention(
            layer.cross_attention, weights, f"{prefix}.encoder_attn", heads
        )
        _set_norm(
            layer.cross_attention_norm,
            weights,
            f"{prefix}.encoder_attn_layer_norm",
        )
        _set_feed_forward(layer.feed_forward, weights, prefix)
        _set_norm(
            layer.feed_forward_norm, weights, f"{prefix}.final_layer_norm"
        )
    if model.encoder_final_norm is not None:
        _set_norm(model.encoder_final_norm, weights, "encoder.layer_norm")
        _set_norm(model.decoder_final_norm, weights, "decoder.layer_norm")
    size = model.target_vocabulary_size or model.vocabulary_size
    bias = (
        weights.get("final_logits_bias").reshape(-1)
        if weights.has("final_logits_bias")
        else np.zeros((size,), "float32")
    )
    if model.output_projection is not None:
        _assign(model.output_projection.kernel, weights.get("lm_head.weight").T)
        _assign(model.output_projection.bias, bias)
    else:
        _assign(model.output_bias.bias, bias)
    # Tied copies and the fixed position tables are not model weights.
    ignored = ("embed_positions", "embed_tokens", "lm_head", "shared")
    return sorted(
        name
        for name in set(weights.state) - weights.used
        if not any(part in name for part in ignored)
    )


# --- decoding settings


def generation_settings(config, generation, max_sequence_length):
    """`GenerationConfig` settings reproducing ``transformers``' generate
    with a model's ``config.json`` and ``generation_config.json``."""
    settings = dict(config)
    settings.update(generation or {})
    pad_id = settings.get("pad_token_id")
    allowed = {pad_id, settings.get("decoder_start_token_id", pad_id)}
    for words in settings.get("bad_words_ids") or []:
        if len(words) != 1 or words[0] not in allowed:
            raise NotImplementedError(
                f"bad_words_ids={settings['bad_words_ids']} bans more than "
                "the padding token; keras-transformer bans only padding "
                "and start tokens. Remove the other entries from "
                f"{GENERATION_CONFIG_FILE} to convert this model."
            )
    num_beams = int(settings.get("num_beams") or 1)
    eos = settings.get("eos_token_id", 0)
    eos = eos[0] if isinstance(eos, list) else eos
    forced = settings.get("forced_eos_token_id")
    forced = forced[0] if isinstance(forced, list) else forced
    # transformers' max_length counts the decoder start token.
    max_length = int(settings.get("max_length") or 20) - 1
    return {
        "method": "beam" if num_beams > 1 else "greedy",
        "beam_size": max(num_beams, 1),
        "length_penalty": float(settings.get("length_penalty", 1.0)),
        "length_penalty_style": "hf",
        "early_stopping": settings.get("early_stopping", False),
        "max_length": max(1, min(max_length, max_sequence_length)),
        "force_end_token": forced is not None and forced == eos,
        "renormalize": bool(settings.get("renormalize_logits", False)),
    }


def load_checkpoint(directory):
    """Converts a Hugging Face Marian checkpoint directory.

    Args:
        directory: holds ``config.json`` (``model_type: marian``),
            ``model.safetensors`` or ``pytorch_model.bin``,
            ``source.spm``, ``target.spm``, ``vocab.json`` and optionally
            ``generation_config.json``.

    Returns:
        ``(model, tokenizer, generation)``: a `Transformer` that gives
        ``MarianMTModel``'s logits, a `MarianTokenizer`, and the
        `GenerationConfig` settings (a dict) that reproduce
        ``MarianMTModel.generate``: beam size, ``transformers``' length
        penalty and stopping rule, maximum length, forced end token.
        `Translator.from_pretrained` composes them.
    """
    directory = os.fspath(directory)
    _require(directory, (CONFIG_FILE,), "a Marian checkpoint")
    config = read_json(os.path.join(directory, CONFIG_FILE))
    if config.get("model_type") != "marian":
        raise ValueError(
            f"{directory}/{CONFIG_FILE} has model_type="
            f"{config.get('model_type')!r}, not 'marian'."
        )
    model = Transformer(**model_options(config))
    unused = convert_weights(model, read_state_dict(directory))
    if unused:
        raise ValueError(
            f"The checkpoint in {directory!r} has {len(unused)} tensors the "
            f"conversion does not use, e.g. {unused[:5]}; it is not a "
            "MarianMTModel keras-transformer can represent."
        )
    tokenizer = load_marian_tokenizer(
        directory,
        decoder_start_id=config.get(
            "decoder_start_token_id", config.get("pad_token_id")
        ),
    )
    if tokenizer.pad_id != config.get("pad_token_id", tokenizer.pad_id):
        raise ValueError(
            f"vocab.json gives <pad> the id {tokenizer.pad_id} but "
            f"config.json has pad_token_id={config['pad_token_id']}."
        )
    generation_path = os.path.join(directory, GENERATION_CONFIG_FILE)
    generation = (
        read_json(generation_path) if os.path.isfile(generation_path) else {}
    )
    settings = generation_settings(
        config, generation, model.max_sequence_length
    )
    return model, tokenizer, settings
