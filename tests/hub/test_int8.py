"""An int8 translator pushed to and pulled from the local Hub server
(hub_server.py) with the real huggingface_hub client: int8 weights in
``model.weights.h5`` and ``model.safetensors``, a card that says so, and
the same weights and translations after the round trip."""

import json
import os

import keras
import numpy as np
from huggingface_hub import ModelCard
from safetensors.numpy import load_file

import keras_transformer as kt
from keras_transformer import hub
from tests.hub.conftest import SENTENCES, TOKEN, USER


def _weights(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def test_int8_translator_round_trip(hub_translator):
    # A copy: the session's translator stays float for the other tests.
    source = hub_translator.model
    model = kt.Transformer.from_config(source.get_config())
    model.set_weights(source.get_weights())
    translator = kt.Translator(
        model, hub_translator.tokenizer, hub_translator.generation_config
    ).quantize("int8")
    pushed = _weights(model)
    int8_paths = sorted(p for p, w in pushed.items() if w.dtype == np.int8)
    # One encoder layer (4 attention projections, 2 feed-forward
    # matrices), one decoder layer (8 and 2) and the shared embedding.
    assert len(int8_paths) == 17
    assert "token_embedding/embeddings" in int8_paths
    assert all(
        p.endswith("/kernel")
        for p in int8_paths
        if p != "token_embedding/embeddings"
    )

    repo = f"{USER}/int8"
    commit = translator.push_to_hub(repo, token=TOKEN)
    directory = hub.resolve_directory(f"hf://{repo}@{commit}")
    metadata = json.loads(open(os.path.join(directory, "metadata.json")).read())
    assert metadata["keras_transformer"]["quantization"] == "int8"
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    assert tensors.keys() == pushed.keys()
    for path, value in pushed.items():
        assert tensors[path].dtype == value.dtype, path
        np.testing.assert_array_equal(tensors[path], value, err_msg=path)
    assert all(tensors[f"{p}_scale"].dtype == np.float32 for p in int8_paths)
    card = ModelCard.load(os.path.join(directory, "README.md"))
    assert (
        "| weights | int8 with float32 scales "
        '(Keras `Model.quantize("int8")`): the kernels of the attention '
        "projections and feed-forward networks (a scale per output unit) "
        "and the shared embedding (per token); biases" in card.text
    )

    loaded = kt.Translator.from_pretrained(f"hf://{repo}@{commit}")
    assert loaded.quantization_mode == "int8"
    pulled = _weights(loaded.model)
    assert pulled.keys() == pushed.keys()
    for path, value in pushed.items():
        assert pulled[path].dtype == value.dtype, path
        np.testing.assert_array_equal(pulled[path], value, err_msg=path)
    assert loaded.translate(SENTENCES) == translator.translate(SENTENCES)
