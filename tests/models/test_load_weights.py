"""Weights that cannot be loaded are named: a truncated, garbage or
foreign file gives a one-line ValueError with its path."""

import re

import keras
import numpy as np
import pytest

from tests.helpers import tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = tiny_model(num_encoder_layers=1, num_decoder_layers=1)
    path = tmp_path_factory.mktemp("weights") / "model.weights.h5"
    model.save_weights(path)
    return model, path


def _fresh():
    return tiny_model(num_encoder_layers=1, num_decoder_layers=1)


def test_good_weights_load(saved):
    model, path = saved
    loaded = _fresh()
    loaded.load_weights(path)
    for x, y in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_weights_name_the_file(saved, tmp_path, damage):
    _, path = saved
    data = path.read_bytes()
    bad = tmp_path / "model.weights.h5"
    bad.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "garbage": b"not hdf5 at all" * 10,
            "empty": b"",
        }[damage]
    )
    with pytest.raises(ValueError) as error:
        _fresh().load_weights(bad)
    message = str(error.value)
    assert message.startswith(f"{bad} cannot be read as Keras weights (")
    assert message.endswith("re-save or re-download it.")
    assert "\n" not in message
    if damage == "truncated":
        assert re.search("truncated", message)


def test_weights_of_another_model_name_the_file(saved):
    _, path = saved
    other = tiny_model(
        num_encoder_layers=1, num_decoder_layers=1, hidden_dim=16
    )
    with pytest.raises(
        ValueError, match=re.escape(f"{path} does not hold this model's")
    ):
        other.load_weights(path)


def test_missing_file_is_still_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        _fresh().load_weights(tmp_path / "missing.weights.h5")
