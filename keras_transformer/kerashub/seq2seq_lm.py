"""The Transformer as a KerasHub `Seq2SeqLM` task: fit on raw text,
generate with this package's cached search."""

import keras
import keras_hub

from keras_transformer.data import text_pairs
from keras_transformer.generation.config import GenerationConfig
from keras_transformer.generation.translator import Translator
from keras_transformer.kerashub.backbone import (
    TransformerBackbone,
    check_preset_architecture,
    resolve_preset,
)
from keras_transformer.kerashub.preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.schedule import transformer_optimizer


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLM(keras_hub.models.Seq2SeqLM):
    """Translation with the Transformer, the KerasHub way.

    `fit` takes raw string pairs (``x={"encoder_text": [...],
    "decoder_text": [...]}`` or a `tf.data.Dataset` of such dicts);
    `compile()` without arguments gives the paper's training setup
    (label-smoothed cross-entropy, section 5.4, and Adam with the
    warm-up schedule of section 5.3); `generate` translates with this
    package's cached beam search and the task's generation settings
    (section 6.1), as `keras_transformer.Translator.translate` does.

    Args:
        backbone: a `TransformerBackbone`.
        preprocessor: a `TransformerSeq2SeqLMPreprocessor`, or None for
            a task that takes token ids.
        generation_config: a `keras_transformer.GenerationConfig` (or its
            dict); the paper's settings when None.

    Example:
    >>> task = keras_hub.models.Seq2SeqLM.from_preset("hf://owner/name")
    >>> task.fit(x={"encoder_text": sources, "decoder_text": targets},
    ...          batch_size=32, epochs=1)
    >>> task.generate("A man rides a bike.")
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerSeq2SeqLMPreprocessor

    def __init__(
        self, backbone, preprocessor=None, generation_config=None, **kwargs
    ):
        self.backbone = backbone
        self.preprocessor = preprocessor
        if isinstance(generation_config, dict):
            generation_config = GenerationConfig.from_dict(generation_config)
        self.generation_config = generation_config or GenerationConfig()
        inputs = backbone.input
        super().__init__(inputs=inputs, outputs=backbone(inputs), **kwargs)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """`keras_hub.models.Seq2SeqLM.from_preset`, refusing in one line
        a preset of another architecture, e.g. a `BartSeq2SeqLM`'s, which
        ``keras_hub.models.Seq2SeqLM.from_preset`` loads instead."""
        # The architecture first, naming the preset as given and reading
        # only its config.json; then a pinned Hub reference becomes its
        # snapshot directory.
        check_preset_architecture(preset, cls, "keras_hub.models.Seq2SeqLM")
        preset = resolve_preset(preset)
        return super().from_preset(preset, load_weights, **kwargs)

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        sampler=None,
        **kwargs,
    ):
        """`keras.Model.compile` with the paper's defaults.

        Args:
            optimizer: ``"auto"``: Adam(0.9, 0.98, 1e-9) with the warm-up
                schedule (`keras_transformer.training.transformer_optimizer`).
            loss: ``"auto"``: label-smoothed (0.1) cross-entropy.
            weighted_metrics: ``"auto"``: token accuracy over real tokens.
            sampler: None for the task's generation settings (beam search
                by default), or a KerasHub sampler (or its name) among
                ``"greedy"``, ``"top_k"`` and ``"top_p"``, which `generate`
                maps onto this package's search.
        """
        if optimizer == "auto":
            optimizer = transformer_optimizer(self.backbone.hidden_dim)
        if loss == "auto":
            loss = LabelSmoothedCrossEntropy(0.1)
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy()]
        keras_hub.models.Task.compile(
            self,
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            **kwargs,
        )
        self.sampler = _sampler_settings(sampler)
        self.generate_function = None

    def fit(self, x=None, y=None, batch_size=None, *, max_tokens=None, **kw):
        """`keras.Model.fit`, on raw text too.

        ``x`` may be ``{"encoder_text": [...], "decoder_text": [...]}``
        (lists of str, checked before any work and reshuffled every epoch,
        like arrays) or a `tf.data.Dataset` of such dicts.

        Args:
            max_tokens: batch raw text by length, within this many tokens
                per batch and side (section 5.1: about 25,000), instead
                of ``batch_size`` pairs per batch; ``x`` may then also be
                an unbatched dataset. Raw-text ``validation_data`` is
                batched the same way. See
                `keras_transformer.data.text_pairs.token_budget_dataset`.
            **kw: the other arguments of `keras.Model.fit`.
        """
        if max_tokens is not None:
            kw = self._token_budget_arguments(x, y, batch_size, max_tokens, kw)
            return super().fit(**kw)
        if isinstance(x, dict) and self.preprocessor is not None:
            text_pairs.check_text_pairs(x)
            if y is None and kw.get("sample_weight") is None:
                x = text_pairs.text_pair_dataset(
                    {k: text_pairs.as_list(x[k]) for k in text_pairs.TEXT_KEYS},
                    batch_size or 32,
                    shuffle=kw.get("shuffle", True),
                )
                batch_size = None
                # Shuffled above; Keras warns that it cannot shuffle a
                # dataset.
                kw["shuffle"] = False
        return super().fit(x=x, y=y, batch_size=batch_size, **kw)

    def _token_budget_arguments(self, x, y, batch_size, max_tokens, kw):
        """`fit`'s arguments with raw text batched by a token budget;
        every argument is checked before any text is read."""
        if batch_size is not None:
            raise ValueError(
                f"fit got batch_size={batch_size} and max_tokens={max_tokens};"
                " give one: pairs per batch, or tokens per batch by length."
            )
        text_pairs.check_max_tokens(max_tokens)
        if self.preprocessor is None:
            raise ValueError(
                f"max_tokens={max_tokens} batches raw text, but this task has "
                "no preprocessor; give one, or batch token ids yourself."
            )
        if y is not None or kw.get("sample_weight") is not None:
            raise ValueError(
                "fit with max_tokens takes raw text alone (the preprocessor "
                "makes the labels and weights); give no y or sample_weight."
            )
        validation = kw.get("validation_data")
        validation_is_text = text_pairs.is_text(validation)
        _check_text(x, "x")
        if validation_is_text:
            _check_text(validation, "validation_data")
        split = kw.pop("validation_split", None)
        if split and not isinstance(x, dict):
            raise ValueError(
                f"validation_split={split} splits arrays, not a dataset; "
                "give validation_data instead."
            )
        pairs = _read_text(x, "x")
        if split and validation is None:
            pairs, validation = _split_pairs(pairs, split)
            validation_is_text = True
        budget = dict(preprocessor=self.preprocessor, max_tokens=max_tokens)
        kw["x"] = text_pairs.token_budget_dataset(
            pairs, shuffle=kw.get("shuffle", True), **budget
        )
        # Shuffled above; Keras warns that it cannot shuffle a dataset.
        kw["shuffle"] = False
        if validation_is_text:
            kw["validation_data"] = text_pairs.token_budget_dataset(
                _read_text(validation, "validation_data"),
                shuffle=False,
                **budget,
            )
        return kw

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Batches that are already the backbone's inputs (from
        # `token_budget_dataset` or `translation_dataset`) pass as they are.
        if isinstance(x, dict) and "encoder_token_ids" in x:
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    def translator(self):
        """A `keras_transformer.Translator` over this task's backbone
        (the same weights) and tokenizer, with its generation settings."""
        if self.preprocessor is None:
            raise ValueError(
                "This task has no preprocessor, so no tokenizer to translate "
                "text with; load it with from_preset(..., preprocessor=...) "
                "or give one."
            )
        tokenizer = self.preprocessor.tokenizer.to_subword_tokenizer()
        return Translator(self.backbone, tokenizer, self.generation_config)

    def generate(self, inputs, max_length=None, **settings):
        """Translates a str or a list of str.

        Args:
            inputs: a str, or a list (or tuple) of str.
            max_length: a fixed limit on generated tokens (default: the
                generation settings' input length + 50).
            **settings: overrides of the `GenerationConfig`, e.g.
                ``beam_size=8``.

        Returns:
            A str for a str, a list of str for a list.
        """
        if max_length is not None:
            settings["max_length"] = max_length
        translator = self.__dict__.get("_cached_translator")
        if translator is None:
            translator = self.translator()
            object.__setattr__(self, "_cached_translator", translator)
        settings = {**(self.sampler or {}), **settings}
        return translator.translate(inputs, verbose=False, **settings)

    def get_config(self):
        config = super().get_config()
        config["generation_config"] = self.generation_config.to_dict()
        return config


def _sampler_settings(sampler):
    """The search settings of a KerasHub sampler (or its name)."""
    if sampler is None:
        return None
    if isinstance(sampler, str):
        sampler = keras_hub.samplers.get(sampler)
    if isinstance(sampler, keras_hub.samplers.GreedySampler):
        return {"method": "greedy"}
    if isinstance(sampler, keras_hub.samplers.TopKSampler):
        return {"method": "sample", "top_k": sampler.k}
    if isinstance(sampler, keras_hub.samplers.TopPSampler):
        return {"method": "sample", "top_p": sampler.p, "top_k": sampler.k or 0}
    raise ValueError(
        f"sampler={type(sampler).__name__} has no counterpart in this "
        "package's search; use None (the generation settings: beam search), "
        "'greedy', 'top_k' or 'top_p'."
    )


def _check_text(x, name):
    """Checks raw text for token-budget batching before it is read."""
    if isinstance(x, dict):
        text_pairs.check_text_pairs(x, name)
    elif hasattr(x, "element_spec"):
        text_pairs.check_text_dataset(x, name)
    else:
        raise ValueError(
            f"{name} is {type(x).__name__}; max_tokens batches raw text: give "
            f"{name}={{'encoder_text': [...], 'decoder_text': [...]}} or a "
            "tf.data.Dataset of such dicts."
        )


def _read_text(x, name):
    if isinstance(x, dict):
        return {key: text_pairs.as_list(x[key]) for key in text_pairs.TEXT_KEYS}
    return text_pairs.read_text_dataset(x, name)


def _split_pairs(pairs, split):
    """Keras's ``validation_split``: the last fraction of the pairs,
    before any shuffling, is the validation set."""
    if not 0 < split < 1:
        raise ValueError(
            f"validation_split={split} must be between 0 and 1 (a fraction "
            "of the pairs)."
        )
    count = len(pairs["encoder_text"])
    cut = count - int(count * split)
    return (
        {key: values[:cut] for key, values in pairs.items()},
        {key: values[cut:] for key, values in pairs.items()},
    )
