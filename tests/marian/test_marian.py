"""Marian (OPUS-MT) checkpoints: a random ``MarianMTModel`` built and
saved locally with ``transformers``, converted, compared with
``transformers`` on logits, tokenizer ids and generated ids."""

import json
import os
import shutil

import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from keras_transformer import marian
from tests.marian.conftest import MAX_NEW_TOKENS, hf_generate

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def translator(marian_checkpoint):
    return kt.Translator.from_pretrained(marian_checkpoint["directory"])


@pytest.fixture(scope="module")
def hf_outputs(marian_checkpoint):
    """transformers' greedy and beam-4 outputs, computed once."""
    return {
        "greedy": hf_generate(marian_checkpoint, num_beams=1),
        "beam": hf_generate(marian_checkpoint, num_beams=4),
    }


def _hf_logits(checkpoint, decoder_ids):
    import torch

    batch = checkpoint["tokenizer"](
        checkpoint["sentences"], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        logits = checkpoint["model"](
            **batch, decoder_input_ids=torch.as_tensor(decoder_ids)
        ).logits
    return batch, logits.numpy()


def _our_logits(model, batch, decoder_ids):
    ids = batch["input_ids"].numpy().astype("int32")
    logits = model(
        {
            "encoder_token_ids": ids,
            "encoder_padding_mask": batch["attention_mask"].numpy(),
            "decoder_token_ids": decoder_ids,
            "decoder_padding_mask": np.ones_like(decoder_ids),
        }
    )
    return ops.convert_to_numpy(logits)


def test_detects_marian_and_maps_the_configuration(marian_checkpoint):
    directory = marian_checkpoint["directory"]
    assert marian.is_marian_directory(directory)
    config = marian_checkpoint["model"].config
    options = marian.model_options(
        json.load(open(os.path.join(directory, "config.json")))
    )
    assert options["activation"] == "silu"
    assert options["scale_embeddings"] is True
    assert options["position_encoding_layout"] == "concatenated"
    assert options["use_output_bias"] is True
    assert options["vocabulary_size"] == config.vocab_size
    assert options["max_sequence_length"] == config.max_position_embeddings


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_logits_equal_transformers(marian_checkpoint, translator, weights):
    directory = marian_checkpoint["directory"]
    if weights == "bin":
        directory += "_bin"
        assert not os.path.exists(os.path.join(directory, "model.safetensors"))
        model = kt.Translator.from_pretrained(directory).model
    else:
        model = translator.model
    rng = np.random.default_rng(0)
    pad = marian_checkpoint["model"].config.pad_token_id
    decoder_ids = rng.integers(1, pad, size=(8, 9)).astype("int32")
    decoder_ids[:, 0] = pad  # the decoder start token
    batch, expected = _hf_logits(marian_checkpoint, decoder_ids)
    assert (batch["attention_mask"].numpy() == 0).any()  # padded sources
    actual = _our_logits(model, batch, decoder_ids)
    assert actual.shape == expected.shape
    # The bias and the scaled weights make the logits far from uniform.
    assert expected.std() > 1.0
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)


def test_load_checkpoint_gives_model_tokenizer_and_settings(
    marian_checkpoint, translator
):
    # The converter knows nothing of translators: Translator composes.
    model, tokenizer, settings = marian.load_checkpoint(
        marian_checkpoint["directory"]
    )
    assert isinstance(model, kt.Transformer)
    assert isinstance(tokenizer, marian.MarianTokenizer)
    assert settings["length_penalty_style"] == "hf"
    assert settings["beam_size"] == 4
    config = translator.generation_config
    assert config == kt.generation.GenerationConfig.from_dict(settings)
    for x, y in zip(
        model.get_weights(), translator.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(x, y)


def test_tokenizer_ids_equal_marian_tokenizer(marian_checkpoint, translator):
    hf = marian_checkpoint["tokenizer"]
    sentences = marian_checkpoint["sentences"] + [
        "Zebras \u00e9t\u00e9 x",  # pieces outside the vocabulary
        ">>deu<< A dog.",
    ]
    ours = translator.tokenizer
    expected = [ids[:-1] for ids in hf(sentences)["input_ids"]]
    assert ours.tokenize(sentences) == expected
    assert ours.end_id == hf.eos_token_id
    assert ours.pad_id == hf.pad_token_id == ours.start_id
    assert ours.vocabulary_size == len(hf.encoder)
    ids = [row + [ours.end_id, ours.pad_id] for row in expected]
    assert ours.detokenize(ids) == hf.batch_decode(
        ids, skip_special_tokens=True
    )


def _our_ids(translator, sentences, **settings):
    results = translator.translate_with_scores(
        sentences, max_length=MAX_NEW_TOKENS, **settings
    )
    return [hypotheses[0].token_ids for hypotheses in results]


def test_greedy_and_beam_ids_equal_generate(
    marian_checkpoint, translator, hf_outputs
):
    sentences = marian_checkpoint["sentences"]
    greedy = _our_ids(translator, sentences, method="greedy")
    beam = _our_ids(translator, sentences)  # beam 4 from generation config
    assert translator.generation_config.beam_size == 4
    assert greedy == hf_outputs["greedy"]
    assert beam == hf_outputs["beam"]
    # Not a trivial comparison: beam search finds other outputs than
    # greedy search, and outputs end before the limit as well as at it.
    assert greedy != beam
    lengths = {len(ids) for ids in beam + greedy}
    assert min(lengths) < MAX_NEW_TOKENS - 1
    assert MAX_NEW_TOKENS - 1 in lengths


@pytest.mark.parametrize(
    "options",
    [
        {"early_stopping": True, "length_penalty": 0.5},
        {"early_stopping": "never", "length_penalty": 2.0},
    ],
    ids=str,
)
def test_beam_stopping_rules_equal_generate(
    marian_checkpoint, translator, options
):
    # transformers' other stopping rules and penalties, in the one beam
    # search of keras_transformer.generation.search.
    expected = hf_generate(marian_checkpoint, num_beams=4, **options)
    ours = _our_ids(translator, marian_checkpoint["sentences"], **options)
    assert ours == expected


@pytest.fixture(scope="module")
def hub():
    """The local Hub server of tests/hub (real huggingface_hub over real
    HTTP): the one the Hub tests started, or a new one."""
    import socket

    from tests.hub.conftest import TOKEN, USER
    from tests.hub.hub_server import HubServer

    port = int(os.environ["KERAS_TRANSFORMER_TEST_HUB_PORT"])
    with socket.socket() as probe:
        running = probe.connect_ex(("127.0.0.1", port)) == 0
    server = None if running else HubServer(port, {TOKEN: USER}).start()
    yield {"token": TOKEN, "user": USER}
    if server is not None:
        server.stop()


def _assert_same_translator(loaded, translator, sentences):
    assert isinstance(loaded.tokenizer, marian.MarianTokenizer)
    assert loaded.generation_config == translator.generation_config
    config = dict(loaded.model.get_config(), name=None)
    assert config == dict(translator.model.get_config(), name=None)
    assert loaded.tokenizer.tokenize(sentences) == (
        translator.tokenizer.tokenize(sentences)
    )
    for x, y in zip(
        loaded.model.get_weights(), translator.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(x, y)


def test_pull_an_opus_mt_repository_from_the_hub(
    marian_checkpoint, translator, hub
):
    """hf://owner/opus-mt-... with transformers' files is converted."""
    from huggingface_hub import HfApi

    repo = f"{hub['user']}/opus-mt-tiny"
    api = HfApi(token=hub["token"])
    api.create_repo(repo, exist_ok=True)
    api.upload_folder(repo_id=repo, folder_path=marian_checkpoint["directory"])
    # Real OPUS-MT repositories also hold other frameworks' weights, which
    # the loader must not download.
    api.upload_file(
        path_or_fileobj=b"not read by keras-transformer",
        path_in_repo="tf_model.h5",
        repo_id=repo,
    )
    loaded = kt.Translator.from_pretrained(f"hf://{repo}")
    _assert_same_translator(loaded, translator, marian_checkpoint["sentences"])
    snapshot = kt.hub.download(repo)
    assert os.path.exists(os.path.join(snapshot, "config.json"))
    assert not os.path.exists(os.path.join(snapshot, "tf_model.h5"))


def test_push_converted_model_and_pull_it_again(
    marian_checkpoint, translator, hub, tmp_path
):
    """The converted model goes to the Hub in keras-transformer's format
    (`Translator.push_to_hub`) and comes back the same."""
    repo = f"{hub['user']}/opus-mt-tiny-keras"
    translator.push_to_hub(repo, token=hub["token"])
    loaded = kt.Translator.from_pretrained(f"hf://{repo}")
    _assert_same_translator(loaded, translator, marian_checkpoint["sentences"])
    # And through a local directory: save, load.
    translator.save(tmp_path / "converted")
    assert not marian.is_marian_directory(tmp_path / "converted")
    loaded = kt.Translator.from_pretrained(tmp_path / "converted")
    _assert_same_translator(loaded, translator, marian_checkpoint["sentences"])


def test_configurations_without_output_bias_still_load(translator):
    # The converted model's get_config / from_config round trip is
    # checked by the Hub tests (the pulled model is built from it).
    config = translator.model.get_config()
    assert config["use_output_bias"] is True
    assert translator.model.output_bias is not None
    # Configurations saved before the option existed load without bias.
    del config["use_output_bias"]
    assert kt.Transformer.from_config(config).output_bias is None


def test_clear_errors(marian_checkpoint, tmp_path):
    directory = tmp_path / "broken"
    shutil.copytree(marian_checkpoint["directory"], directory)
    os.remove(directory / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        kt.Translator.from_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config["activation_function"] = "gelu_fast"
    with pytest.raises(ValueError, match="gelu_fast"):
        marian.model_options(config)
    os.remove(directory / "vocab.json")
    with pytest.raises(FileNotFoundError, match="vocab.json"):
        marian.load_marian_tokenizer(directory)
