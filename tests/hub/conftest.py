"""The Hub tests' fixtures: a local Hub server on the port that
tests/conftest.py put into ``HF_ENDPOINT`` before huggingface_hub was
imported, a write token, and a tiny translator."""

import dataclasses
import os
import pathlib
import shutil

import keras
import pytest

import keras_transformer as kt
from tests.helpers import tiny_model
from tests.hub.hub_server import HubServer

TOKEN = "hf_alice_write_token"
# One owner per session: the Hugging Face cache (HF_HOME) outlives a test
# run, and a run must not find blobs that an earlier run cached.
USER = f"alice-{os.urandom(3).hex()}"
SENTENCES = [
    "a man rides a bike",
    "two dogs play in the snow",
    "a woman is reading a book",
    "the children run on the beach",
    "a dog",
    "people walk at night",
]


@pytest.fixture(scope="session", autouse=True)
def hub_server():
    from huggingface_hub import constants

    port = int(os.environ["KERAS_TRANSFORMER_TEST_HUB_PORT"])
    assert constants.ENDPOINT == f"http://127.0.0.1:{port}"
    server = HubServer(port, tokens={TOKEN: USER}).start()
    yield server
    server.stop()
    for folder in pathlib.Path(constants.HF_HUB_CACHE).glob(
        f"models--{USER}--*"
    ):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def hub_translator():
    """A tiny translator with random weights: greedy and short, so a
    translation takes milliseconds yet depends on every weight."""
    from keras_transformer.data import train_tokenizer

    tokenizer = train_tokenizer(
        sentences=SENTENCES * 10, vocabulary_size=96, byte_fallback=False
    )
    keras.utils.set_random_seed(3)
    model = tiny_model(
        vocabulary_size=tokenizer.vocabulary_size,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        max_sequence_length=12,
    )
    # No end token from random weights: every output has the full length.
    embedding = model.decoder_token_embedding
    weights = embedding.get_weights()
    for weight in weights:
        if weight.shape[0] == tokenizer.vocabulary_size:
            weight[tokenizer.end_id] = 0.0
    embedding.set_weights(weights)
    return kt.Translator(
        model, tokenizer, method="greedy", max_length=6, batch_size=8
    )


@pytest.fixture(scope="session")
def run_results():
    """A training record as `run_recipe` writes it to results.json."""
    from keras_transformer.training.recipes import RunSummary, get_recipe

    recipe = get_recipe("multi30k_en_de")
    summary = RunSummary(
        recipe=recipe.name,
        output="runs/multi30k_en_de",
        steps=6000,
        train_minutes=58.7,
        parameters=15_000_000,
        bleu=31.42,
        bleu_signature="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|"
        "version:2.6.0",
        stopped_by_time_limit=False,
    )
    return {
        **dataclasses.asdict(summary),
        "recipe_settings": dataclasses.asdict(recipe),
        "averaged_checkpoints": [f"step-{s}.weights.h5" for s in (5000, 6000)],
    }
