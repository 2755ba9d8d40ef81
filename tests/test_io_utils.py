"""read_json names the file and what is wrong with it."""

import json

import pytest

from keras_transformer.io_utils import read_json, write_json


def test_round_trip(tmp_path):
    path = tmp_path / "config.json"
    write_json(path, {"b": [1, 2.5, None], "a": "é"})
    assert read_json(path) == {"a": "é", "b": [1, 2.5, None]}


@pytest.mark.parametrize(
    "data, what",
    [
        (b"\x89HDF\r\n\x1a\n\x00\x00", r"byte 0 is not UTF-8"),
        (b"garbage", r"line 1, column 1\): Expecting value"),
        (b'{"hidden_dim": 64,\n  "num_heads": }', r"line 2, column 16"),
        (b"", r"line 1, column 1"),
    ],
)
def test_bad_file_is_named_with_what_is_wrong(tmp_path, data, what):
    path = tmp_path / "config.json"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=what) as error:
        read_json(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not valid JSON (")
    assert message.endswith("; re-save or re-download it.")
    assert "\n" not in message
    # The decoding error stays attached for debugging.
    assert isinstance(
        error.value.__cause__, (json.JSONDecodeError, UnicodeDecodeError)
    )


def test_directory_and_missing_file(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ValueError, match="config.json is a directory"):
        read_json(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_json(tmp_path / "missing.json")
