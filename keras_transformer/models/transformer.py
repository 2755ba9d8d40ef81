import contextlib
import os

import keras
from keras import ops

from keras_transformer import backends
from keras_transformer.layers import (
    SinusoidalPositionEncoding,
    TokenEmbedding,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.output_bias import OutputBias
from keras_transformer.models.configs import get_config as get_named_config
from keras_transformer.utils import (
    check_bool,
    check_padding_mask,
    check_positive,
    check_positive_float,
    check_rate,
    check_token_ids,
    describe,
)

INPUT_NAMES = (
    "encoder_token_ids",
    "encoder_padding_mask",
    "decoder_token_ids",
    "decoder_padding_mask",
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The encoder-decoder Transformer (Vaswani et al., 2017, section 3).

    A functional `keras.Model` with four named inputs, each
    ``(batch, length)``: ``encoder_token_ids``, ``encoder_padding_mask``,
    ``decoder_token_ids`` (the target shifted right, teacher forcing) and
    ``decoder_padding_mask``; masks are 1 for real tokens. Source and
    target may have different lengths. The output is the next-token
    logits, ``(batch, target_length, vocabulary_size)``, in float32 under
    every dtype policy.

    By default one embedding matrix, scaled by sqrt(d_model), serves the
    source, the target and the pre-softmax projection (3.4); positions are
    the fixed sinusoids of 3.5; dropout is applied to the sums of
    embeddings and positions and to every sublayer output (5.4).

    For decoding, `encode` runs the encoder once, `init_cache` prepares
    the decoder's key/value caches and `decode` runs the decoder one or
    more steps at a time with them.

    Args:
        vocabulary_size: size of the (shared) vocabulary.
        num_encoder_layers, num_decoder_layers: N (6 in the paper).
        hidden_dim: d_model.
        num_heads: h; d_k = d_v = hidden_dim / num_heads.
        intermediate_dim: d_ff.
        dropout: P_drop.
        max_sequence_length: longest source or target accepted.
        attention_dropout: dropout on attention weights (0 in the paper).
        activation_dropout: dropout inside the feed-forward network.
        activation: feed-forward activation, ``"relu"`` in the paper.
        normalize_first: pre-norm layers plus a final LayerNorm after each
            stack, instead of the paper's post-norm.
        layer_norm_epsilon: epsilon of every LayerNorm.
        target_vocabulary_size: a separate target vocabulary; the source
            and target embeddings are then separate matrices.
        share_embeddings: one matrix for source and target tokens (when
            the vocabularies are the same).
        tie_output_embeddings: the pre-softmax projection reuses the
            target embedding matrix; otherwise it has its own.
        scale_embeddings: multiply embeddings by sqrt(d_model).
        position_encoding_layout: ``"interleaved"`` (the paper's sin/cos on
            even/odd channels) or ``"concatenated"``.
        use_output_bias: add a learned bias to the logits after the tied
            pre-softmax projection (Marian's ``final_logits_bias``; the
            paper has none). An untied projection always has its bias.
        dtype: dtype policy of every layer, e.g. ``"mixed_bfloat16"``.

    Example:
    >>> model = Transformer.from_config_name("tiny", vocabulary_size=1000)
    >>> ids = keras.ops.ones((2, 9), "int32")
    >>> logits = model({
    ...     "encoder_token_ids": ids,
    ...     "encoder_padding_mask": keras.ops.ones((2, 9), "int32"),
    ...     "decoder_token_ids": ids[:, :5],
    ...     "decoder_padding_mask": keras.ops.ones((2, 5), "int32"),
    ... })
    >>> logits.shape
    (2, 5, 1000)

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    """

    def __init__(
        self,
        vocabulary_size,
        num_encoder_layers=6,
        num_decoder_layers=6,
        hidden_dim=512,
        num_heads=8,
        intermediate_dim=2048,
        dropout=0.1,
        max_sequence_length=1024,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation="relu",
        normalize_first=False,
        layer_norm_epsilon=1e-5,
        target_vocabulary_size=None,
        share_embeddings=True,
        tie_output_embeddings=True,
        scale_embeddings=True,
        position_encoding_layout="interleaved",
        use_output_bias=False,
        dtype=None,
        **kwargs,
    ):
        settings = {
            "vocabulary_size": vocabulary_size,
            "num_encoder_layers": num_encoder_layers,
            "num_decoder_layers": num_decoder_layers,
            "hidden_dim": hidden_dim,
            "num_heads": num_heads,
            "intermediate_dim": intermediate_dim,
            "dropout": dropout,
            "max_sequence_length": max_sequence_length,
            "attention_dropout": attention_dropout,
            "activation_dropout": activation_dropout,
            "activation": activation,
            "normalize_first": normalize_first,
            "layer_norm_epsilon": layer_norm_epsilon,
            "target_vocabulary_size": target_vocabulary_size,
            "share_embeddings": share_embeddings,
            "tie_output_embeddings": tie_output_embeddings,
            "scale_embeddings": scale_embeddings,
            "position_encoding_layout": position_encoding_layout,
            "use_output_bias": use_output_bias,
        }
        _check_settings(settings)

        # === Layers ===
        layers = _make_layers(settings, dtype)
        # The layers are attributes for the decoding entry points; the
        # functional graph tracks their weights. They are set before
        # `Model.__init__`, which torch's module bookkeeping forbids through
        # Keras' tracking `__setattr__`, so bypass it.
        for name, layer in layers.items():
            object.__setattr__(self, name, layer)

        # === Functional Model ===
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in INPUT_NAMES
        }
        encoder_output = self._encode(
            inputs["encoder_token_ids"], inputs["encoder_padding_mask"]
        )
        decoder_output = self._decode(
            inputs["decoder_token_ids"],
            inputs["decoder_padding_mask"],
            encoder_output,
            inputs["encoder_padding_mask"],
        )
        logits = self.project(decoder_output)
        super().__init__(inputs=inputs, outputs=logits, dtype=dtype, **kwargs)
        if dtype is not None:
            # A functional model's `__init__` drops `dtype`: without this
            # the model would report (and `get_config` save) the global
            # policy while its layers compute under `dtype`.
            self.dtype_policy = dtype

        # === Config ===
        for name, value in settings.items():
            setattr(self, name, value)

    # --- the three stages, shared by the graph and the decoding entry points

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return
        # A backend's own compilation of Keras's training step, where the
        # seam has one (`keras_transformer.backends`).
        if not backends.make_train_function(self):
            super().make_train_function(force=force)

    def _encode(self, token_ids, padding_mask, training=None):
        x = self.encoder_token_embedding(token_ids)
        x = x + self.encoder_position_encoding(x)
        x = self.encoder_embedding_dropout(x, training=training)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x

    def _decode(
        self,
        token_ids,
        padding_mask,
        encoder_output,
        encoder_padding_mask,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        x = self.decoder_token_embedding(token_ids)
        start = 0 if cache_update_index is None else cache_update_index
        x = x + self.decoder_position_encoding(x, start_index=start)
        x = self.decoder_embedding_dropout(x, training=training)
        new_self_cache = []
        for i, layer in enumerate(self.decoder_layers):
            if cache is None:
                x = layer(
                    x,
                    encoder_output,
                    decoder_padding_mask=padding_mask,
                    encoder_padding_mask=encoder_padding_mask,
                    training=training,
                )
            else:
                x, layer_cache = layer(
                    x,
                    decoder_padding_mask=padding_mask,
                    encoder_padding_mask=encoder_padding_mask,
                    self_attention_cache=_layer_cache(
                        cache["self_attention"], i
                    ),
                    self_attention_cache_update_index=cache_update_index,
                    cross_attention_cache=_layer_cache(
                        cache["cross_attention"], i
                    ),
                    training=training,
                )
                new_self_cache.append(layer_cache)
        if self.decoder_final_norm is not None:
            x = self.decoder_final_norm(x)
        if cache is None:
            return x
        if isinstance(cache["self_attention"], (tuple, list)):
            new_self_cache = tuple(tuple(pair) for pair in new_self_cache)
            return x, dict(cache, self_attention=new_self_cache)
        cache = dict(cache, self_attention=ops.stack(new_self_cache, axis=1))
        return x, cache

    def project(self, decoder_output):
        """The float32 next-token logits of decoder outputs, ``(batch,
        length, vocabulary_size)``: the pre-softmax projection (3.4)."""
        if self.output_projection is None:
            logits = self.decoder_token_embedding(decoder_output, reverse=True)
        else:
            logits = self.output_projection(decoder_output)
        if self.output_bias is not None:
            logits = self.output_bias(logits)
        return self.logits_cast(logits)

    # --- input checks

    def __call__(self, inputs, *args, **kwargs):
        # Before Keras converts or traces anything; values that are only
        # known inside a compiled function are checked where they are
        # made (the data pipeline) or handed in (`fit`, `predict`). The
        # steps of `fit` and `predict` skip it: their array inputs were
        # checked on entry, and on torch the per-step copy of device
        # tensors to the host would stall the GPU queue.
        if not self.__dict__.get("_inputs_checked", False):
            self._check_values(inputs)
        return super().__call__(inputs, *args, **kwargs)

    @contextlib.contextmanager
    def _inputs_checked_on_entry(self, x, y=None):
        """Checks ``x`` and the labels ``y``, then runs the body without
        checking them again at every step. Written into ``__dict__`` to
        stay out of Keras' and torch's attribute tracking."""
        self._check_values(x, _labels(y))
        previous = self.__dict__.get("_inputs_checked", False)
        self.__dict__["_inputs_checked"] = True
        try:
            yield
        finally:
            self.__dict__["_inputs_checked"] = previous

    def call(self, inputs, training=None, mask=None):
        self._check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask)

    def _check_values(self, inputs, labels=None):
        """Raises a ValueError naming the first token id outside the
        vocabulary (an embedding lookup would read no row: NaN logits on
        JAX) or the first mask entry that is not 0 or 1, where the
        values are concrete: NumPy arrays or eager tensors."""
        if not isinstance(inputs, dict):
            return
        target = (
            ("target_vocabulary_size", self.target_vocabulary_size)
            if self.target_vocabulary_size
            else ("vocabulary_size", self.vocabulary_size)
        )
        sizes = {
            "encoder": ("vocabulary_size", self.vocabulary_size),
            "decoder": target,
        }
        for side, (setting, size) in sizes.items():
            fix = (
                f"the model's {setting} is {size}. Encode the text with "
                "the tokenizer the model was trained with, or build the "
                f"model with a larger {setting}."
            )
            name = f"{side}_token_ids"
            if name in inputs:
                check_token_ids(name, inputs[name], size, fix)
            name = f"{side}_padding_mask"
            if name in inputs:
                check_padding_mask(name, inputs[name])
        if labels is not None:
            check_token_ids(
                "labels",
                labels,
                target[1],
                f"the model's {target[0]} is {target[1]}. Labels are the "
                "target's token ids: use the tokenizer of "
                "decoder_token_ids.",
            )

    def fit(self, x=None, y=None, *args, **kwargs):
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and validation:
            self._check_values(
                validation[0],
                _labels(validation[1]) if len(validation) > 1 else None,
            )
        with self._inputs_checked_on_entry(x, y):
            return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        with self._inputs_checked_on_entry(x, y):
            return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        with self._inputs_checked_on_entry(x):
            return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, y=None, *args, **kwargs):
        with self._inputs_checked_on_entry(x, y):
            return super().train_on_batch(x, y, *args, **kwargs)

    def test_on_batch(self, x, y=None, *args, **kwargs):
        with self._inputs_checked_on_entry(x, y):
            return super().test_on_batch(x, y, *args, **kwargs)

    def predict_on_batch(self, x):
        with self._inputs_checked_on_entry(x):
            return super().predict_on_batch(x)

    def _check_inputs(self, inputs):
        if not isinstance(inputs, dict):
            raise ValueError(
                "Transformer expects a dict with the keys "
                f"{list(INPUT_NAMES)}; got {type(inputs).__name__}."
            )
        missing = [name for name in INPUT_NAMES if name not in inputs]
        if missing:
            raise ValueError(
                f"Transformer inputs are missing {missing}; got the keys "
                f"{sorted(inputs)}. Pass all of {list(INPUT_NAMES)}."
            )
        for side in ("encoder", "decoder"):
            ids_shape = tuple(inputs[f"{side}_token_ids"].shape)
            mask_shape = tuple(inputs[f"{side}_padding_mask"].shape)
            if len(ids_shape) != 2:
                raise ValueError(
                    f"{side}_token_ids must have shape (batch, length); got "
                    f"shape {ids_shape}."
                )
            if len(mask_shape) != 2 or any(
                a is not None and b is not None and a != b
                for a, b in zip(ids_shape, mask_shape, strict=False)
            ):
                raise ValueError(
                    f"{side}_padding_mask has shape {mask_shape} but "
                    f"{side}_token_ids has shape {ids_shape}. The mask needs "
                    "one entry per token: 1 for a real token, 0 for padding."
                )
            length = ids_shape[1]
            if length is not None and length > self.max_sequence_length:
                raise ValueError(
                    f"{side}_token_ids has length {length}, longer than "
                    f"max_sequence_length={self.max_sequence_length}. "
                    "Truncate the inputs or build the model with a larger "
                    "max_sequence_length."
                )

    # --- decoding entry points

    def encode(self, encoder_token_ids, encoder_padding_mask, training=False):
        """Runs the encoder once: ``(batch, source_length, hidden_dim)``."""
        return self._encode(
            encoder_token_ids, encoder_padding_mask, training=training
        )

    def init_cache(self, encoder_output, max_length, *, stacked=True):
        """The key/value caches for decoding up to ``max_length`` tokens.

        Returns a dict: ``"self_attention"``, zeros of shape
        ``(batch, num_decoder_layers, 2, max_length, num_heads, head_dim)``,
        and ``"cross_attention"``, the encoder output's keys and values for
        every layer, ``(batch, num_decoder_layers, 2, source_length,
        num_heads, head_dim)``, computed here once.

        With ``stacked=False`` each entry is instead a tuple with one
        ``(keys, values)`` pair per decoder layer, each tensor ``(batch,
        num_heads, max_length, head_dim)`` (``source_length`` for
        cross-attention): the layout for a compiled decoding loop, which
        XLA then reads and updates in place instead of slicing and
        transposing the stacked caches every step (see
        `MultiHeadAttention`). `decode` takes either and returns the same.
        """
        if max_length > self.max_sequence_length:
            raise ValueError(
                f"max_length={max_length} is longer than "
                f"max_sequence_length={self.max_sequence_length}."
            )
        batch_size = ops.shape(encoder_output)[0]
        head_dim = self.hidden_dim // self.num_heads
        if not stacked:
            shape = (batch_size, self.num_heads, max_length, head_dim)
            return {
                "self_attention": tuple(
                    (
                        ops.zeros(shape, dtype=self.compute_dtype),
                        ops.zeros(shape, dtype=self.compute_dtype),
                    )
                    for _ in self.decoder_layers
                ),
                "cross_attention": tuple(
                    layer.compute_cross_attention_cache(
                        encoder_output, stacked=False
                    )
                    for layer in self.decoder_layers
                ),
            }
        self_attention = ops.zeros(
            (
                batch_size,
                self.num_decoder_layers,
                2,
                max_length,
                self.num_heads,
                head_dim,
            ),
            dtype=self.compute_dtype,
        )
        cross_attention = ops.stack(
            [
                layer.compute_cross_attention_cache(encoder_output)
                for layer in self.decoder_layers
            ],
            axis=1,
        )
        return {
            "self_attention": self_attention,
            "cross_attention": cross_attention,
        }

    def decode(
        self,
        decoder_token_ids,
        cache,
        cache_update_index,
        encoder_padding_mask,
        decoder_padding_mask=None,
    ):
        """Runs the decoder on tokens at positions ``cache_update_index``
        onwards, attending to the cached earlier positions.

        Args:
            decoder_token_ids: ``(batch, steps)``, usually one step.
            cache: from `init_cache` (stacked or split) or a previous
                `decode`.
            cache_update_index: position of the first token of this call.
            encoder_padding_mask: ``(batch, source_length)``.
            decoder_padding_mask: optional ``(batch, max_length)`` mask of
                the cached positions; causality is applied in any case.

        Returns:
            ``(logits, cache)``: float32 logits ``(batch, steps,
            vocabulary_size)`` and the cache with this step written in.
        """
        x, cache = self._decode(
            decoder_token_ids,
            decoder_padding_mask,
            None,
            encoder_padding_mask,
            cache=cache,
            cache_update_index=cache_update_index,
            training=False,
        )
        return self.project(x), cache

    def decode_without_cache(
        self,
        decoder_token_ids,
        encoder_output,
        encoder_padding_mask,
        decoder_padding_mask=None,
        position=None,
    ):
        """Runs the decoder over all of ``decoder_token_ids`` at once,
        with causal masking, as training does: decoding without the
        key/value cache (the reference the cache is tested against).

        Args:
            decoder_token_ids: ``(batch, length)``.
            encoder_output: ``(batch, source_length, hidden_dim)``, from
                `encode`.
            encoder_padding_mask: ``(batch, source_length)``.
            decoder_padding_mask: ``(batch, length)``; None when every
                token is real.
            position: if given (int or scalar tensor), only this
                position is projected onto the vocabulary.

        Returns:
            float32 logits ``(batch, length, vocabulary_size)``, or
            ``(batch, 1, vocabulary_size)`` with ``position``.
        """
        x = self._decode(
            decoder_token_ids,
            decoder_padding_mask,
            encoder_output,
            encoder_padding_mask,
            training=False,
        )
        if position is not None:
            x = ops.take(x, ops.reshape(position, (1,)), axis=1)
        return self.project(x)

    # --- attention weights

    def attention_weights(self, inputs, training=False):
        """The logits and the attention weights of every layer and head.

        Runs the model on the same inputs as `call`, teacher-forced, with
        each attention sublayer computing its weights explicitly (softmax
        in float32). The logits match those of `call` (to float32
        rounding).

        Args:
            inputs: the dict of `call`.
            training: whether dropout is active.

        Returns:
            ``(logits, weights)``: ``weights`` is a dict of lists with one
            float32 tensor per layer: ``"encoder_self_attention"``,
            ``(batch, num_heads, source_length, source_length)``;
            ``"decoder_self_attention"``, ``(batch, num_heads,
            target_length, target_length)``; ``"cross_attention"``,
            ``(batch, num_heads, target_length, source_length)``. Axes
            are (query, key); rows sum to 1; padded keys and later
            positions get weight 0. Rows of padded queries are kept:
            crop them with the padding masks (`Translator.attention`
            returns cropped arrays).
        """
        self._check_inputs(inputs)
        self._check_values(inputs)
        ids = {
            name: ops.convert_to_tensor(inputs[name], "int32")
            for name in INPUT_NAMES
        }
        source_mask = ids["encoder_padding_mask"]
        weights = {
            "encoder_self_attention": [],
            "decoder_self_attention": [],
            "cross_attention": [],
        }
        # The steps of `_encode` and `_decode`, asking each layer for its
        # weights.
        x = self.encoder_token_embedding(ids["encoder_token_ids"])
        x = x + self.encoder_position_encoding(x)
        x = self.encoder_embedding_dropout(x, training=training)
        for layer in self.encoder_layers:
            x, scores = layer(
                x,
                padding_mask=source_mask,
                return_attention_scores=True,
                training=training,
            )
            weights["encoder_self_attention"].append(scores)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        y = self.decoder_token_embedding(ids["decoder_token_ids"])
        y = y + self.decoder_position_encoding(y)
        y = self.decoder_embedding_dropout(y, training=training)
        for layer in self.decoder_layers:
            y, scores = layer(
                y,
                x,
                decoder_padding_mask=ids["decoder_padding_mask"],
                encoder_padding_mask=source_mask,
                return_attention_scores=True,
                training=training,
            )
            weights["decoder_self_attention"].append(scores["self_attention"])
            weights["cross_attention"].append(scores["cross_attention"])
        if self.decoder_final_norm is not None:
            y = self.decoder_final_norm(y)
        return self.project(y), weights

    # --- configuration

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """`keras.Model.load_weights`, with errors that name the file: a
        truncated or foreign file otherwise surfaces as h5py's "Unable to
        synchronously open file (truncated file ...)" without a path."""
        try:
            return super().load_weights(
                filepath, skip_mismatch=skip_mismatch, **kwargs
            )
        except FileNotFoundError:
            raise
        except OSError as error:
            raise ValueError(
                f"{os.fspath(filepath)} cannot be read as Keras weights "
                f"({_one_line(error)}); the file is truncated or corrupt: "
                "re-save or re-download it."
            ) from error
        except (ValueError, KeyError) as error:
            raise ValueError(
                f"{os.fspath(filepath)} does not hold this model's weights: "
                f"{_one_line(error)}"
            ) from error

    @classmethod
    def from_config_name(cls, name, **kwargs):
        """A model of a named configuration: ``"tiny"``, ``"base"`` or
        ``"big"`` (Table 3). Keyword arguments override its values;
        ``vocabulary_size`` is required."""
        config = get_named_config(name)
        config.update(kwargs)
        return cls(**config)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            **{name: getattr(self, name) for name in _SETTINGS},
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def _one_line(error):
    return " ".join(str(error).split()) or type(error).__name__


def _labels(y):
    """``y`` when it looks like a batch of label ids, ``(batch, length)``,
    else None (a dataset, or labels of another form, pass unchecked)."""
    if y is None or isinstance(y, (dict, list, tuple)):
        return None
    return y if len(getattr(y, "shape", ())) == 2 else None


def _layer_cache(cache, index):
    """Decoder layer ``index``'s part of a stacked or split cache."""
    if isinstance(cache, (tuple, list)):
        return tuple(cache[index])
    return cache[:, index]


# The constructor's arguments that `get_config` saves, besides name,
# trainable and dtype.
_SETTINGS = (
    "vocabulary_size",
    "num_encoder_layers",
    "num_decoder_layers",
    "hidden_dim",
    "num_heads",
    "intermediate_dim",
    "dropout",
    "max_sequence_length",
    "attention_dropout",
    "activation_dropout",
    "activation",
    "normalize_first",
    "layer_norm_epsilon",
    "target_vocabulary_size",
    "share_embeddings",
    "tie_output_embeddings",
    "scale_embeddings",
    "position_encoding_layout",
    "use_output_bias",
)


def _check_settings(s):
    """Raises ValueError naming the first setting a `Transformer` cannot
    be built with, its value and its type."""
    for name in (
        "vocabulary_size",
        "num_encoder_layers",
        "num_decoder_layers",
        "hidden_dim",
        "num_heads",
        "intermediate_dim",
        "max_sequence_length",
    ):
        check_positive(name, s[name])
    if s["target_vocabulary_size"] is not None:
        check_positive("target_vocabulary_size", s["target_vocabulary_size"])
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        check_rate(name, s[name])
    for name in (
        "normalize_first",
        "share_embeddings",
        "tie_output_embeddings",
        "scale_embeddings",
        "use_output_bias",
    ):
        check_bool(name, s[name])
    check_positive_float("layer_norm_epsilon", s["layer_norm_epsilon"])
    layouts = SinusoidalPositionEncoding.LAYOUTS
    if s["position_encoding_layout"] not in layouts:
        raise ValueError(
            "position_encoding_layout="
            f"{describe(s['position_encoding_layout'])} must be one of "
            f"{layouts}."
        )
    _check_activation(s["activation"])
    if s["hidden_dim"] % s["num_heads"]:
        raise ValueError(
            f"num_heads={s['num_heads']} must divide "
            f"hidden_dim={s['hidden_dim']} (d_k = d_model / h). Choose a "
            "hidden_dim that is a multiple of num_heads."
        )
    if s["hidden_dim"] % 2:
        raise ValueError(
            f"hidden_dim={s['hidden_dim']} must be even for sinusoidal "
            "position encodings (one sine and one cosine per "
            "frequency). Use an even hidden_dim."
        )


def _check_activation(activation):
    """Raises ValueError for an activation Keras does not know."""
    if callable(activation):
        return
    try:
        keras.activations.get(activation)
    except (ValueError, TypeError):
        raise ValueError(
            f"activation={describe(activation)} is not a Keras activation; "
            "use a name such as 'relu' (the paper's) or 'gelu', or a "
            "callable."
        ) from None


def _make_layers(s, dtype):
    """Every layer of a `Transformer` with settings ``s``, by attribute
    name, created in a fixed order (unseeded layers draw their seeds in
    it): embeddings and positions (3.4, 3.5), the two stacks (3.1), then
    the output layers."""
    sides = ("encoder", "decoder")
    layers = _embedding_layers(s, dtype)
    for side in sides:
        layers[f"{side}_position_encoding"] = SinusoidalPositionEncoding(
            s["max_sequence_length"],
            layout=s["position_encoding_layout"],
            dtype=dtype,
            name=f"{side}_position_encoding",
        )
    for side in sides:
        layers[f"{side}_embedding_dropout"] = Dropout(
            s["dropout"], dtype=dtype, name=f"{side}_embedding_dropout"
        )
    layer_kwargs = {
        name: s[name]
        for name in (
            "num_heads",
            "intermediate_dim",
            "dropout",
            "attention_dropout",
            "activation_dropout",
            "activation",
            "normalize_first",
            "layer_norm_epsilon",
        )
    }
    for side, layer_class in zip(
        sides, (TransformerEncoderLayer, TransformerDecoderLayer), strict=True
    ):
        layers[f"{side}_layers"] = [
            layer_class(**layer_kwargs, dtype=dtype, name=f"{side}_layer_{i}")
            for i in range(s[f"num_{side}_layers"])
        ]
    for side in sides:
        # Pre-norm stacks end with a norm of their own.
        layers[f"{side}_final_norm"] = None
        if s["normalize_first"]:
            layers[f"{side}_final_norm"] = keras.layers.LayerNormalization(
                epsilon=s["layer_norm_epsilon"],
                dtype=dtype,
                name=f"{side}_final_norm",
            )
    layers.update(_output_layers(s, dtype))
    return layers


def _embedding_layers(s, dtype):
    """The token embeddings: one matrix for source and target (3.4)
    unless the vocabularies differ or sharing is off."""
    target_size = s["target_vocabulary_size"]
    separate = target_size not in (None, s["vocabulary_size"])

    def embedding(size, name):
        return TokenEmbedding(
            size,
            s["hidden_dim"],
            scale=s["scale_embeddings"],
            dtype=dtype,
            name=name,
        )

    if s["share_embeddings"] and not separate:
        shared = embedding(s["vocabulary_size"], "token_embedding")
        return {
            "encoder_token_embedding": shared,
            "decoder_token_embedding": shared,
        }
    return {
        "encoder_token_embedding": embedding(
            s["vocabulary_size"], "encoder_token_embedding"
        ),
        "decoder_token_embedding": embedding(
            target_size or s["vocabulary_size"], "decoder_token_embedding"
        ),
    }


def _output_layers(s, dtype):
    """The pre-softmax projection (tied to the target embedding by
    default, 3.4), an optional logits bias, and the float32 cast."""
    target_size = s["target_vocabulary_size"] or s["vocabulary_size"]
    layers = {"output_projection": None, "output_bias": None}
    if not s["tie_output_embeddings"]:
        layers["output_projection"] = keras.layers.Dense(
            target_size, dtype=dtype, name="output_projection"
        )
    elif s["use_output_bias"]:
        layers["output_bias"] = OutputBias(
            target_size, dtype=dtype, name="output_bias"
        )
    # Logits leave the model in float32 under mixed precision, so that
    # the softmax of the loss is computed in full precision.
    layers["logits_cast"] = keras.layers.Activation(
        "linear", dtype="float32", name="logits"
    )
    return layers
