"""Decoding: greedy search, beam search and sampling with a cached,
compiled decoder; the `Translator`; BLEU evaluation.

Example:
>>> from keras_transformer.generation import Translator, evaluate_bleu
>>> translator = Translator(model, tokenizer)  # beam 4, alpha 0.6
>>> translator.translate(["A man rides a bike."])
>>> evaluate_bleu(translator, sources, references).signature
"""

from keras_transformer.generation.base import BaseTranslator, Hypothesis
from keras_transformer.generation.config import GenerationConfig
from keras_transformer.generation.evaluation import (
    BleuResult,
    corpus_bleu,
    evaluate_bleu,
)
from keras_transformer.generation.generator import (
    Generator,
    SearchResult,
    hypothesis_lengths,
)
from keras_transformer.generation.search import (
    beam_search,
    greedy_search,
    length_penalty,
)
from keras_transformer.generation.translator import (
    SentenceAttention,
    Translator,
)

__all__ = [
    "BaseTranslator",
    "BleuResult",
    "GenerationConfig",
    "Generator",
    "Hypothesis",
    "SearchResult",
    "SentenceAttention",
    "Translator",
    "beam_search",
    "corpus_bleu",
    "evaluate_bleu",
    "greedy_search",
    "hypothesis_lengths",
    "length_penalty",
]
