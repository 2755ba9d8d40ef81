"""Shared fixtures: a tiny Transformer trained for a few seconds to
reverse sequences, so that searches have a real distribution to explore."""

import keras
import numpy as np
import pytest

from tests.helpers import save_version_1, tiny_model

PAD, UNK, START, END = 0, 1, 2, 3
VOCABULARY_SIZE = 16


def reverse_task(rng, num_examples, min_length=2, max_length=7):
    """Sources of random tokens + [end]; targets are the reversed tokens.

    Returns ``(source_ids, source_mask, decoder_ids, labels, weights)``.
    """
    width = max_length + 1
    sources = np.zeros((num_examples, width), "int32")
    decoder = np.zeros((num_examples, width), "int32")
    labels = np.zeros((num_examples, width), "int32")
    for i in range(num_examples):
        length = rng.integers(min_length, max_length + 1)
        tokens = rng.integers(4, VOCABULARY_SIZE, length)
        sources[i, : length + 1] = [*tokens, END]
        decoder[i, : length + 1] = [START, *tokens[::-1]]
        labels[i, : length + 1] = [*tokens[::-1], END]
    source_mask = (sources != PAD).astype("int32")
    weights = (labels != PAD).astype("float32")
    return sources, source_mask, decoder, labels, weights


def build_tiny_model(seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    config = dict(
        vocabulary_size=VOCABULARY_SIZE,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        max_sequence_length=32,
    )
    config.update(kwargs)
    return tiny_model(**config)


def train_tiny_model(epochs=4):
    """A tiny model trained briefly on reversal: good, not perfect."""
    model = build_tiny_model(seed=1)
    rng = np.random.default_rng(1)
    sources, source_mask, decoder, labels, weights = reverse_task(rng, 2048)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(
        {
            "encoder_token_ids": sources,
            "encoder_padding_mask": source_mask,
            "decoder_token_ids": decoder,
            "decoder_padding_mask": (decoder != PAD).astype("int32")
            | (np.arange(decoder.shape[1]) == 0),
        },
        labels,
        sample_weight=weights,
        batch_size=64,
        epochs=epochs,
        verbose=0,
        shuffle=False,
    )
    return model


@pytest.fixture(scope="session")
def trained_model():
    return train_tiny_model()


@pytest.fixture(scope="session")
def trained_generator(trained_model):
    """One `Generator` for the session, so compiled searches are reused."""
    from keras_transformer.generation import Generator

    return Generator(trained_model)


# Every search on the trained model decodes to this length, so that the
# tests share compiled programs (targets have at most 8 tokens).
TRAINED_MAX_LENGTH = 12


@pytest.fixture(scope="session")
def random_weights():
    """Untrained weights for the trained model's architecture."""
    return build_tiny_model(seed=5).get_weights()


@pytest.fixture
def random_generator(trained_generator, random_weights):
    """The session's `Generator` with untrained weights loaded for one
    test: flat distributions, long outputs. Compiled searches read the
    model's current weights, so the programs are shared with the trained
    model's tests instead of compiled again for another model."""
    model = trained_generator.model
    trained = model.get_weights()
    model.set_weights(random_weights)
    try:
        yield trained_generator
    finally:
        model.set_weights(trained)


@pytest.fixture(scope="session")
def test_batch():
    """Held-out reversal sources: ``(source_ids, source_mask)``."""
    rng = np.random.default_rng(123)
    sources, source_mask, *_ = reverse_task(rng, 24)
    return sources, source_mask


SENTENCES = [
    "a man rides a bike",
    "two dogs play in the snow",
    "a woman is reading a book",
    "the children run on the beach",
    "a dog",
    "people walk at night",
]
# With 96 ids every sentence above is at most 7 subword tokens, and the
# translator's max_sequence_length is 8: every batch has one source
# length (one bucket) and one decoding length, so the translator tests
# compile one search per batch bucket and beam size, not one per shape.
TRANSLATOR_MAX_SEQUENCE_LENGTH = 8


@pytest.fixture(scope="session")
def tokenizer():
    from keras_transformer.data import train_tokenizer

    return train_tokenizer(
        sentences=SENTENCES * 10, vocabulary_size=96, byte_fallback=False
    )


@pytest.fixture(scope="session")
def translator(tokenizer):
    """An untrained tiny translator: fast, deterministic, and producing
    non-empty outputs up to its length limit."""
    from keras_transformer.generation import Translator

    model = build_tiny_model(
        seed=2,
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=TRANSLATOR_MAX_SEQUENCE_LENGTH,
    )
    # A zero embedding for the end token gives it logit 0 (tied output
    # embeddings) below the best of 95 random logits: outputs never end
    # at the first step, whatever the backend's random initialization.
    embedding = model.decoder_token_embedding
    weights = embedding.get_weights()
    for weight in weights:
        if weight.shape[0] == tokenizer.vocabulary_size:
            weight[tokenizer.end_id] = 0.0
    embedding.set_weights(weights)
    # Batches of 2: batch buckets 1 and 2 only.
    return Translator(model, tokenizer, max_length_offset=4, batch_size=2)


@pytest.fixture(scope="session")
def saved_translator(translator, tmp_path_factory):
    directory = tmp_path_factory.mktemp("translator")
    translator.save(directory)
    return directory


@pytest.fixture(scope="session")
def saved_version_1(translator, tmp_path_factory):
    """The translator in the layout of format version 1."""
    directory = tmp_path_factory.mktemp("translator-version-1")
    save_version_1(translator, directory)
    return directory


def _pad(rows, width):
    array = np.full((len(rows), width), PAD, "int32")
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


def train_reversal_model(tokenizer):
    """The tiny translator's model trained for a few steps to reverse the
    words of the test sentences: translations that end, and differ."""
    model = build_tiny_model(
        seed=2,
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=TRANSLATOR_MAX_SEQUENCE_LENGTH,
    )
    limit = TRANSLATOR_MAX_SEQUENCE_LENGTH - 1
    reversed_words = [" ".join(s.split()[::-1]) for s in SENTENCES]
    sources, targets = (
        [row[:limit] for row in tokenizer.tokenize(texts).to_list()]
        for texts in (SENTENCES, reversed_words)
    )
    width = limit + 1
    labels = _pad([[*row, END] for row in targets], width)
    decoder = _pad([[START, *row] for row in targets], width)
    # Without XLA: compiling the training step would cost more than the
    # few steps it runs.
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    model.fit(
        {
            "encoder_token_ids": _pad([[*row, END] for row in sources], width),
            "encoder_padding_mask": _pad(
                [[1] * (len(r) + 1) for r in sources], width
            ),
            "decoder_token_ids": decoder,
            "decoder_padding_mask": (labels != PAD).astype("int32"),
        },
        labels,
        sample_weight=(labels != PAD).astype("float32"),
        batch_size=len(SENTENCES),
        epochs=30,
        verbose=0,
    )
    return model
