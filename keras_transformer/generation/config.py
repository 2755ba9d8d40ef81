"""`GenerationConfig`: the decoding settings of a translator, checked
once when made."""

import dataclasses

from keras_transformer.generation.generator import METHODS
from keras_transformer.generation.search import (
    FINITE_SETTINGS,
    check_finite,
    check_length_penalty,
    check_num_return_sequences,
)
from keras_transformer.utils import replace_settings

LONG_INPUTS = ("truncate", "error")


@dataclasses.dataclass
class GenerationConfig:
    """Decoding settings of a `Translator`; the defaults are the paper's
    (section 6.1: beam size 4, alpha 0.6, input length + 50).

    Attributes:
        method: ``"beam"``, ``"greedy"`` or ``"sample"``.
        beam_size: hypotheses kept alive per sentence.
        length_penalty: alpha of the GNMT penalty ``((5 + |Y|) / 6) **
            alpha``; 0 ranks by raw log-probability (shorter outputs),
            larger values favour longer outputs.
        max_length: a fixed limit on generated tokens; None for the
            paper's rule, source length plus ``max_length_offset``.
            Either way capped at the model's ``max_sequence_length``.
        max_length_offset: the 50 of "input length + 50", where the input
            length counts the source's subword tokens and its end token.
        num_return_sequences: translations returned per sentence.
        temperature, top_k, top_p: sampling filters (``method="sample"``).
        seed: sampling seed.
        batch_size: sentences decoded together (sorted by length).
        long_inputs: a sentence with more subword tokens than the model
            accepts (``max_sequence_length - 1``, one place is the end
            token) is ``"truncate"``-d with a warning, or raises a
            `ValueError` with ``"error"``.
        length_penalty_style: ``"gnmt"`` (the paper's beam search) or
            ``"hf"`` (Hugging Face ``transformers``' beam search and
            penalty ``|Y| ** alpha``; converted OPUS-MT models use it).
        early_stopping: ``transformers``' stopping rule with ``"hf"``:
            False, True or ``"never"``.
        force_end_token: the last allowed token is the end token.
        renormalize: log-softmax again after removing banned tokens.
    """

    method: str = "beam"
    beam_size: int = 4
    length_penalty: float = 0.6
    max_length: int | None = None
    max_length_offset: int = 50
    num_return_sequences: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    batch_size: int = 32
    long_inputs: str = "truncate"
    length_penalty_style: str = "gnmt"
    early_stopping: bool | str = False
    force_end_token: bool = False
    renormalize: bool = False

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not one of {METHODS}.")
        if self.long_inputs not in LONG_INPUTS:
            raise ValueError(
                f"long_inputs={self.long_inputs!r} is not one of {LONG_INPUTS}."
            )
        for name in ("beam_size", "batch_size"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"{name}={value} must be a positive integer.")
        check_num_return_sequences(
            self.num_return_sequences, self.method, self.beam_size
        )
        for name in FINITE_SETTINGS:
            check_finite(name, getattr(self, name))
        check_length_penalty(self.length_penalty, self.length_penalty_style)

    def replace(self, **overrides):
        """A copy with some settings changed; unknown names raise."""
        return replace_settings(
            self, overrides, "generation settings", error=TypeError
        )

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config):
        return cls().replace(**config)
