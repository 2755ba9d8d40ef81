import keras
from keras import ops

from keras_transformer.layers import (
    SinusoidalPositionEncoding,
    TokenEmbedding,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)
from keras_transformer.layers._utils import (
    apply_dropout,
    backend_override,
    call_layer,
    check_positive,
    check_rate,
    concrete_index,
)
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.output_bias import OutputBias
from keras_transformer.models.configs import get_config as get_named_config

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
        check_positive("vocabulary_size", vocabulary_size)
        check_positive("num_encoder_layers", num_encoder_layers)
        check_positive("num_decoder_layers", num_decoder_layers)
        check_positive("hidden_dim", hidden_dim)
        check_positive("num_heads", num_heads)
        check_positive("max_sequence_length", max_sequence_length)
        check_rate("dropout", dropout)
        if hidden_dim % num_heads:
            raise ValueError(
                f"num_heads={num_heads} must divide hidden_dim={hidden_dim} "
                "(d_k = d_model / h). Choose a hidden_dim that is a multiple "
                "of num_heads."
            )
        if hidden_dim % 2:
            raise ValueError(
                f"hidden_dim={hidden_dim} must be even for sinusoidal "
                "position encodings (one sine and one cosine per "
                "frequency). Use an even hidden_dim."
            )
        if target_vocabulary_size is not None:
            check_positive("target_vocabulary_size", target_vocabulary_size)
        separate_vocabularies = target_vocabulary_size not in (
            None,
            vocabulary_size,
        )
        shared = share_embeddings and not separate_vocabularies
        layer_kwargs = {
            "num_heads": num_heads,
            "intermediate_dim": intermediate_dim,
            "dropout": dropout,
            "attention_dropout": attention_dropout,
            "activation_dropout": activation_dropout,
            "activation": activation,
            "normalize_first": normalize_first,
            "layer_norm_epsilon": layer_norm_epsilon,
            "dtype": dtype,
        }

        # === Layers ===
        layers = {}

        def embedding(size, name):
            return TokenEmbedding(
                size,
                hidden_dim,
                scale=scale_embeddings,
                dtype=dtype,
                name=name,
            )

        if shared:
            layers["encoder_token_embedding"] = embedding(
                vocabulary_size, "token_embedding"
            )
            layers["decoder_token_embedding"] = layers[
                "encoder_token_embedding"
            ]
        else:
            layers["encoder_token_embedding"] = embedding(
                vocabulary_size, "encoder_token_embedding"
            )
            layers["decoder_token_embedding"] = embedding(
                target_vocabulary_size or vocabulary_size,
                "decoder_token_embedding",
            )

        def position_encoding(name):
            return SinusoidalPositionEncoding(
                max_sequence_length,
                layout=position_encoding_layout,
                dtype=dtype,
                name=name,
            )

        layers["encoder_position_encoding"] = position_encoding(
            "encoder_position_encoding"
        )
        layers["decoder_position_encoding"] = position_encoding(
            "decoder_position_encoding"
        )
        layers["encoder_embedding_dropout"] = Dropout(
            dropout, dtype=dtype, name="encoder_embedding_dropout"
        )
        layers["decoder_embedding_dropout"] = Dropout(
            dropout, dtype=dtype, name="decoder_embedding_dropout"
        )
        layers["encoder_layers"] = [
            TransformerEncoderLayer(**layer_kwargs, name=f"encoder_layer_{i}")
            for i in range(num_encoder_layers)
        ]
        layers["decoder_layers"] = [
            TransformerDecoderLayer(**layer_kwargs, name=f"decoder_layer_{i}")
            for i in range(num_decoder_layers)
        ]
        layers["encoder_final_norm"] = layers["decoder_final_norm"] = None
        if normalize_first:
            layers["encoder_final_norm"] = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon,
                dtype=dtype,
                name="encoder_final_norm",
            )
            layers["decoder_final_norm"] = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon,
                dtype=dtype,
                name="decoder_final_norm",
            )
        layers["output_projection"] = None
        if not tie_output_embeddings:
            layers["output_projection"] = keras.layers.Dense(
                target_vocabulary_size or vocabulary_size,
                dtype=dtype,
                name="output_projection",
            )
        layers["output_bias"] = None
        if use_output_bias and tie_output_embeddings:
            layers["output_bias"] = OutputBias(
                target_vocabulary_size or vocabulary_size,
                dtype=dtype,
                name="output_bias",
            )
        # Logits leave the model in float32 under mixed precision, so that
        # the softmax of the loss is computed in full precision.
        layers["logits_cast"] = keras.layers.Activation(
            "linear", dtype="float32", name="logits"
        )

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
        logits = self._logits(decoder_output)
        super().__init__(inputs=inputs, outputs=logits, dtype=dtype, **kwargs)
        if dtype is not None:
            # A functional model's `__init__` drops `dtype`: without this
            # the model would report (and `get_config` save) the global
            # policy while its layers compute under `dtype`.
            self.dtype_policy = dtype

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.max_sequence_length = max_sequence_length
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.activation = activation
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.target_vocabulary_size = target_vocabulary_size
        self.share_embeddings = share_embeddings
        self.tie_output_embeddings = tie_output_embeddings
        self.scale_embeddings = scale_embeddings
        self.position_encoding_layout = position_encoding_layout
        self.use_output_bias = use_output_bias

    # --- the three stages, shared by the graph and the decoding entry points

    def _encode(self, token_ids, padding_mask, training=None):
        x = call_layer(self.encoder_token_embedding, token_ids)
        x = x + call_layer(self.encoder_position_encoding, x)
        x = apply_dropout(self.encoder_embedding_dropout, x, training)
        for layer in self.encoder_layers:
            x = call_layer(
                layer, x, padding_mask=padding_mask, training=training
            )
        if self.encoder_final_norm is not None:
            x = call_layer(self.encoder_final_norm, x)
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
        cache_update_index = concrete_index(cache_update_index)
        x = call_layer(self.decoder_token_embedding, token_ids)
        start = 0 if cache_update_index is None else cache_update_index
        x = x + call_layer(self.decoder_position_encoding, x, start_index=start)
        x = apply_dropout(self.decoder_embedding_dropout, x, training)
        new_self_cache, written_in_place = [], []
        for i, layer in enumerate(self.decoder_layers):
            if cache is None:
                x = call_layer(
                    layer,
                    x,
                    encoder_output,
                    decoder_padding_mask=padding_mask,
                    encoder_padding_mask=encoder_padding_mask,
                    training=training,
                )
            else:
                view = _layer_cache(cache["self_attention"], i)
                x, layer_cache = call_layer(
                    layer,
                    x,
                    decoder_padding_mask=padding_mask,
                    encoder_padding_mask=encoder_padding_mask,
                    self_attention_cache=view,
                    self_attention_cache_update_index=cache_update_index,
                    cross_attention_cache=_layer_cache(
                        cache["cross_attention"], i
                    ),
                    training=training,
                )
                new_self_cache.append(layer_cache)
                written_in_place.append(layer_cache is view)
        if self.decoder_final_norm is not None:
            x = call_layer(self.decoder_final_norm, x)
        if cache is None:
            return x
        if backend_override("write_cache_in_place") and all(written_in_place):
            # Every layer wrote into its view of the cache and returned it.
            return x, cache
        if isinstance(cache["self_attention"], (tuple, list)):
            new_self_cache = tuple(tuple(pair) for pair in new_self_cache)
            return x, dict(cache, self_attention=new_self_cache)
        cache = dict(cache, self_attention=ops.stack(new_self_cache, axis=1))
        return x, cache

    def _logits(self, decoder_output):
        if self.output_projection is None:
            logits = call_layer(
                self.decoder_token_embedding, decoder_output, reverse=True
            )
        else:
            logits = call_layer(self.output_projection, decoder_output)
        if self.output_bias is not None:
            logits = call_layer(self.output_bias, logits)
        return call_layer(self.logits_cast, logits)

    # --- input checks

    def call(self, inputs, training=None, mask=None):
        self._check_inputs(inputs)
        return super().call(inputs, training=training, mask=mask)

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
            A new cache, except inside the eager decoding of torch
            (`generation.compile.torch_direct_calls`), which writes the
            step into a stacked ``cache`` itself and returns it.
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
        return self._logits(x), cache

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
        return self._logits(x)

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
        return self._logits(y), weights

    # --- training

    def make_train_function(self, force=False):
        # On JAX's CPU, XLA compiles the step with an analysis that spares
        # it a copy of every variable each step (see `_jax_compile`).
        if keras.backend.backend() != "jax":
            return super().make_train_function(force)
        from keras_transformer import _jax_compile

        with _jax_compile.train_step_options():
            return super().make_train_function(force)

    # --- configuration

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
            "vocabulary_size": self.vocabulary_size,
            "num_encoder_layers": self.num_encoder_layers,
            "num_decoder_layers": self.num_decoder_layers,
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "max_sequence_length": self.max_sequence_length,
            "attention_dropout": self.attention_dropout,
            "activation_dropout": self.activation_dropout,
            "activation": self.activation,
            "normalize_first": self.normalize_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "target_vocabulary_size": self.target_vocabulary_size,
            "share_embeddings": self.share_embeddings,
            "tie_output_embeddings": self.tie_output_embeddings,
            "scale_embeddings": self.scale_embeddings,
            "position_encoding_layout": self.position_encoding_layout,
            "use_output_bias": self.use_output_bias,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def _layer_cache(cache, index):
    """Decoder layer ``index``'s part of a stacked or split cache."""
    if isinstance(cache, (tuple, list)):
        return tuple(cache[index])
    return cache[:, index]
