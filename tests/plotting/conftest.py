"""A tiny untrained translator with a real tokenizer, for the attention
and plotting tests."""

import pytest

from tests.generation.conftest import SENTENCES, build_tiny_model

MAX_SEQUENCE_LENGTH = 16


@pytest.fixture(scope="module")
def tokenizer():
    from keras_transformer.data import train_tokenizer

    return train_tokenizer(
        sentences=SENTENCES * 10, vocabulary_size=96, byte_fallback=False
    )


@pytest.fixture(scope="module")
def translator(tokenizer):
    from keras_transformer.generation import Translator

    model = build_tiny_model(
        seed=3,
        vocabulary_size=tokenizer.vocabulary_size,
        num_encoder_layers=2,
        num_decoder_layers=2,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
    )
    return Translator(
        model, tokenizer, method="greedy", max_length_offset=3, batch_size=4
    )
