"""A translator loads and translates on JAX and torch without TensorFlow,
and a damaged saved translator names the damaged file."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer.generation import Translator
from tests.generation.conftest import SENTENCES

# Unicode, a piece the vocabulary lacks, an empty line and a sentence
# over the length limit, besides the fixture's sentences.
INPUTS = [*SENTENCES, "Straße und Fahrrad", "", " ".join(SENTENCES)]

# Run in a fresh interpreter: loads the translator, translates INPUTS,
# prints the translations and the TensorFlow modules it imported.
CHILD = """
import json, sys, warnings
from keras_transformer.generation import Translator
warnings.simplefilter("ignore")
translator = Translator.from_pretrained(sys.argv[1])
translations = translator.translate(json.loads(sys.argv[2]))
roots = ("tensorflow", "tensorflow_text")
modules = sorted(m for m in sys.modules if m.split(".")[0] in roots)
print(json.dumps({"translations": translations, "tensorflow": modules}))
"""


def _run_child(script, *args):
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def no_tensorflow_backend():
    if keras.backend.backend() == "tensorflow":
        pytest.skip("the TensorFlow backend imports TensorFlow by design")


def test_translating_imports_no_tensorflow(
    no_tensorflow_backend, translator, saved_translator
):
    with pytest.warns(UserWarning, match="truncated"):
        expected = translator.translate(INPUTS)
    child = _run_child(CHILD, str(saved_translator), json.dumps(INPUTS))
    assert child["tensorflow"] == []
    assert child["translations"] == expected
    assert expected[len(SENTENCES) + 1] == "" and all(expected[:2])


def test_cli_translate_imports_no_tensorflow(
    no_tensorflow_backend, translator, saved_translator, tmp_path
):
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    script = (
        "import json, sys\n"
        "from keras_transformer.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "modules = sorted(\n"
        "    m for m in sys.modules if m.startswith('tensorflow')\n"
        ")\n"
        "print(json.dumps({'code': code, 'tensorflow': modules}))\n"
    )
    child = _run_child(
        script,
        "translate",
        "--model",
        str(saved_translator),
        "--input",
        str(source),
        "--output",
        str(output),
        "--quiet",
    )
    assert child == {"code": 0, "tensorflow": []}
    lines = output.read_text(encoding="utf-8").splitlines()
    assert lines == translator.translate(SENTENCES)


# --- damaged files are named


@pytest.fixture
def copy(saved_translator, tmp_path):
    directory = tmp_path / "translator"
    shutil.copytree(saved_translator, directory)
    return directory


@pytest.fixture
def copy_version_1(saved_version_1, tmp_path):
    directory = tmp_path / "translator-version-1"
    shutil.copytree(saved_version_1, directory)
    return directory


def _load_error(directory):
    with pytest.raises(ValueError) as error:
        Translator.from_pretrained(directory)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_truncated_weights_are_named(copy):
    path = copy / "model.weights.h5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    message = _load_error(copy)
    assert message.startswith(f"{path} cannot be ")
    assert "truncated" in message and "re-download" in message


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"\x89HDF garbage \xff\xfe", "is not valid JSON (byte 0"),
        (b'{"format_version": 1,', "is not valid JSON (line 1"),
        (b"[1, 2]", "holds a JSON list, not an object"),
        (
            b'{"format_version": 1, "model_class": "Transformer"}',
            "model_config",
        ),
    ],
)
def test_garbage_config_is_named(copy_version_1, content, expected):
    copy = copy_version_1
    path = copy / "config.json"
    path.write_bytes(content)
    message = _load_error(copy)
    assert str(path) in message and expected in message


@pytest.mark.parametrize("layout", ["preset", "version 1"])
def test_config_that_builds_no_model_is_named(copy, copy_version_1, layout):
    directory = copy if layout == "preset" else copy_version_1
    path = directory / "config.json"
    config = json.loads(path.read_text())
    key = "config" if layout == "preset" else "model_config"
    config[key]["hidden_dim"] = "sixty-four"
    path.write_text(json.dumps(config))
    message = _load_error(directory)
    assert message.startswith(f"The model config in {path} does not build")
    assert "hidden_dim='sixty-four'" in message and "re-download" in message


def test_a_preset_of_another_model_is_named(copy):
    path = copy / "config.json"
    config = json.loads(path.read_text())
    config["registered_name"] = "keras_hub>BartBackbone"
    path.write_text(json.dumps(config))
    message = _load_error(copy)
    assert message.startswith(f"{path} holds a keras_hub>BartBackbone preset")
    assert "keras_transformer>TransformerBackbone" in message


@pytest.mark.parametrize(
    "settings, expected",
    [
        ("[4]", "holds a JSON list"),
        ('{"beam_size": 0}', "beam_size=0"),
        (
            '{"length_penalty": NaN}',
            "length_penalty=nan must be a finite number (0.6 in the paper; "
            "0 disables it). Re-save or re-download the translator.",
        ),
        (
            '{"temperature": Infinity}',
            "temperature=inf must be a finite number (1 leaves the "
            "probabilities as they are). Re-save or re-download the "
            "translator.",
        ),
    ],
)
def test_garbage_generation_config_is_named(
    copy, copy_version_1, settings, expected
):
    path = copy_version_1 / "generation_config.json"
    path.write_text(settings)
    message = _load_error(copy_version_1)
    assert str(path) in message and expected in message
    # In a preset the settings are the task's.
    path = copy / "task.json"
    task = json.loads(path.read_text())
    task["config"]["generation_config"] = json.loads(settings)
    path.write_text(json.dumps(task))
    message = _load_error(copy)
    assert str(path) in message and expected in message


@pytest.mark.parametrize(
    "name", ["assets/tokenizer/vocabulary.spm", "tokenizer/tokenizer.model"]
)
def test_garbage_tokenizer_model_is_named(copy, copy_version_1, name):
    directory = copy if name.startswith("assets") else copy_version_1
    path = directory / name
    path.write_bytes(np.random.default_rng(0).bytes(64))
    message = _load_error(directory)
    assert message.startswith(f"{path} is not a SentencePiece model: ")
    assert "re-download or re-save the translator" in message
