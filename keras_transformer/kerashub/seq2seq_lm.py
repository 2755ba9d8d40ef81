"""The Transformer as a KerasHub `Seq2SeqLM` task: fit on raw text,
generate with this package's cached search."""

import keras
import keras_hub

from keras_transformer.data.text_pairs import text_pair_dataset
from keras_transformer.generation.translator import GenerationConfig, Translator
from keras_transformer.kerashub.backbone import TransformerBackbone
from keras_transformer.kerashub.preprocessor import (
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.schedule import transformer_optimizer

TEXT_KEYS = ("encoder_text", "decoder_text")


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

    def fit(self, x=None, y=None, batch_size=None, shuffle=True, **kwargs):
        """`keras.Model.fit`; ``x`` may be a dict of raw string lists,
        ``{"encoder_text": [...], "decoder_text": [...]}``, checked before
        any work and reshuffled every epoch (``shuffle``) like arrays."""
        if isinstance(x, dict) and self.preprocessor is not None:
            check_text_pairs(x)
            if y is None and kwargs.get("sample_weight") is None:
                x = text_pair_dataset(
                    {key: _as_list(x[key]) for key in TEXT_KEYS},
                    batch_size or 32,
                    shuffle=shuffle,
                )
                batch_size = None
                # Shuffled above; Keras warns that it cannot shuffle a
                # dataset.
                shuffle = False
        return super().fit(
            x=x, y=y, batch_size=batch_size, shuffle=shuffle, **kwargs
        )

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


def _as_list(values):
    return [values] if isinstance(values, (str, bytes)) else list(values)


def check_text_pairs(x):
    """Checks ``{"encoder_text": [...], "decoder_text": [...]}`` before
    any work: both keys, str entries, the same number of each."""
    for key in TEXT_KEYS:
        if key not in x:
            raise ValueError(
                f"x has no {key!r} key (it has {sorted(x)}); give "
                "x={'encoder_text': sources, 'decoder_text': targets}."
            )
    lengths = {}
    for key in TEXT_KEYS:
        values = _as_list(x[key])
        for index, value in enumerate(values):
            if not isinstance(value, (str, bytes)):
                raise ValueError(
                    f"x[{key!r}][{index}] is {type(value).__name__} "
                    f"{value!r}, not a str; give one str per sentence."
                )
        lengths[key] = len(values)
    if lengths["encoder_text"] != lengths["decoder_text"]:
        raise ValueError(
            f"x['encoder_text'] has {lengths['encoder_text']} sentences "
            f"and x['decoder_text'] {lengths['decoder_text']}; give one "
            "target per source."
        )
