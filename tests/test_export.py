"""Serving export: a translator written as a TensorFlow SavedModel, loaded
in a fresh Python that has tensorflow and tensorflow-text but cannot
import keras_transformer, gives the translator's own translations and
scores; under JAX and torch the export runs in a TensorFlow subprocess."""

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap

import numpy as np
import pytest

import keras_transformer as kt
from tests.generation.conftest import (
    SENTENCES,
    tokenizer,  # noqa: F401 (the fixture)
    train_reversal_model,
)
from tests.marian.conftest import (
    NUM_SENTENCES,
    marian_checkpoint,  # noqa: F401 (the fixture)
    mixed_batch,
)

# Far more subword tokens than the tiny model's max_sequence_length.
LONG = " and ".join(SENTENCES)
BATCH = ["", "a dog", LONG, " \t\u3000", "a man rides a bike"]

# Runs in `python -I -S`: the standard library and site-packages
# (without its .pth files, so without the editable install), not the
# repository.
SERVE_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    sys.path.extend(json.loads(sys.argv[1]))
    assert importlib.util.find_spec("keras_transformer") is None
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (registers the SentencePiece ops)

    request = json.load(sys.stdin)
    results = {}
    for name, directory in request["directories"].items():
        loaded = tf.saved_model.load(directory)
        serve = loaded.signatures["serving_default"]
        outputs = serve(sentences=tf.constant(request["sentences"]))
        results[name] = {
            "inputs": sorted(serve.structured_input_signature[1]),
            "dtypes": {k: v.dtype.name for k, v in outputs.items()},
            "translations": [
                t.decode("utf-8") for t in outputs["translations"].numpy()
            ],
            "scores": outputs["scores"].numpy().tolist(),
        }
    print(json.dumps(results))
    """
)


def serve_in_plain_tensorflow(directories, sentences, cwd):
    """Each SavedModel's outputs on ``sentences``, computed by a process
    that cannot import keras_transformer."""
    paths = sysconfig.get_paths()
    process = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            SERVE_SCRIPT,
            json.dumps([paths["purelib"], paths["platlib"]]),
        ],
        input=json.dumps(
            {
                "directories": {k: str(v) for k, v in directories.items()},
                "sentences": sentences,
            }
        ),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


def expected_outputs(translator, sentences):
    """`Translator.translate_with_scores`'s best hypotheses, warning of
    the truncated sentence."""
    with pytest.warns(UserWarning, match="truncated"):
        results = translator.translate_with_scores(sentences, verbose=False)
    return [row[0].text for row in results], [row[0].score for row in results]


def assert_served_like_translator(served, translator, sentences):
    translations, scores = expected_outputs(translator, sentences)
    assert served["inputs"] == ["sentences"]
    assert served["dtypes"] == {"translations": "string", "scores": "float32"}
    assert served["translations"] == translations
    np.testing.assert_allclose(served["scores"], scores, rtol=0, atol=1e-4)
    blank = [i for i, s in enumerate(sentences) if not s.strip()]
    assert blank and all(served["scores"][i] == 0.0 for i in blank)
    assert all(served["translations"][i] == "" for i in blank)
    # Real outputs: the other sentences translate, not all alike.
    others = [translations[i] for i in range(len(sentences)) if i not in blank]
    assert len(set(others) - {""}) >= 2


# --- a trained tiny translator


@pytest.fixture(scope="module")
def trained_model(tokenizer):  # noqa: F811
    return train_reversal_model(tokenizer)


@pytest.fixture(scope="module")
def translators(trained_model, tokenizer):  # noqa: F811
    common = dict(max_length_offset=4, batch_size=2)
    # int8: a copy of the model, quantized (weights and tied embedding).
    int8_model = kt.Transformer.from_config(trained_model.get_config())
    int8_model.set_weights(trained_model.get_weights())
    return {
        "greedy": kt.Translator(
            trained_model, tokenizer, method="greedy", **common
        ),
        "beam": kt.Translator(
            trained_model, tokenizer, method="beam", beam_size=4, **common
        ),
        "int8": kt.Translator(
            int8_model, tokenizer, method="beam", beam_size=4, **common
        ).quantize("int8"),
    }


@pytest.fixture(scope="module")
def exported(translators, tmp_path_factory):
    """Each translator exported once; the beam one over a stale,
    non-empty directory with ``overwrite=True``."""
    root = tmp_path_factory.mktemp("exported")
    directories = {name: root / name for name in translators}
    directories["beam"].mkdir()
    (directories["beam"] / "stale.txt").write_text("an older export")
    translators["greedy"].export(directories["greedy"])
    translators["beam"].export(directories["beam"], overwrite=True)
    translators["int8"].export(directories["int8"])
    return directories


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("serving")
    return serve_in_plain_tensorflow(exported, BATCH, cwd)


@pytest.mark.parametrize("method", ["greedy", "beam", "int8"])
def test_saved_model_translates_like_the_translator(
    served, translators, method
):
    assert_served_like_translator(served[method], translators[method], BATCH)
    if method == "int8":
        # The int8 weights were served, not the float ones.
        beam = np.array(served["beam"]["scores"])
        assert np.abs(np.array(served["int8"]["scores"]) - beam).max() > 1e-4


def test_export_replaces_atomically(exported):
    beam = exported["beam"]
    assert not (beam / "stale.txt").exists()
    assert (beam / "saved_model.pb").is_file()
    # No staging or set-aside directory is left next to the exports.
    assert sorted(os.listdir(beam.parent)) == ["beam", "greedy", "int8"]


def test_export_refuses_a_non_empty_directory(translators, tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=re.escape(str(target))):
        translators["greedy"].export(target)
    assert (target / "keep.txt").read_text() == "mine"


def test_unexportable_settings_fail_before_any_work(translators, tmp_path):
    greedy = translators["greedy"]
    sampler = kt.Translator(greedy.model, greedy.tokenizer, method="sample")
    with pytest.raises(ValueError, match="method='sample'"):
        sampler.export(tmp_path / "model")
    too_long = kt.Translator(greedy.model, greedy.tokenizer, max_length=99)
    with pytest.raises(ValueError, match="max_length=99"):
        too_long.export(tmp_path / "model")
    assert os.listdir(tmp_path) == []


def test_failed_export_names_the_cause(translators, tmp_path):
    # The SavedModel's parent is a file: the export fails writing it (in
    # the TensorFlow subprocess under JAX and torch) and says why.
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    with pytest.raises((RuntimeError, OSError), match="file.txt"):
        translators["greedy"].export(blocker / "model")
    assert sorted(os.listdir(tmp_path)) == ["file.txt"]


def test_whitespace_is_pythons():
    tf = pytest.importorskip("tensorflow")
    from keras_transformer.export import WHITESPACE, strip

    characters = [chr(i) for i in range(0x3100) if not 0xD800 <= i < 0xE000]
    matched = tf.strings.regex_full_match(characters, WHITESPACE).numpy()
    python = [c.isspace() for c in characters]
    assert matched.tolist() == python
    texts = ["\u3000 a b\u2029\t", "\x1c\x85x", "  ", "a\u00a0b"]
    stripped = [t.decode() for t in strip(tf.constant(texts)).numpy()]
    assert stripped == [t.strip() for t in texts]


# --- a converted Marian (OPUS-MT) model


@pytest.fixture(scope="module")
def marian_export(marian_checkpoint, tmp_path_factory):  # noqa: F811
    """The converted checkpoint with its own settings (beam 4,
    ``transformers``' length penalty and stopping rule), exported once."""
    sentences = marian_checkpoint["sentences"]
    assert len(sentences) == NUM_SENTENCES
    batch = mixed_batch(sentences)
    translator = kt.Translator.from_pretrained(
        marian_checkpoint["directory"], max_length=14, batch_size=4
    )
    root = tmp_path_factory.mktemp("marian_export")
    translator.export(root / "beam")
    served = serve_in_plain_tensorflow({"beam": root / "beam"}, batch, root)
    return translator, served["beam"], batch


def test_marian_saved_model_translates_like_the_translator(marian_export):
    translator, served, batch = marian_export
    config = translator.generation_config
    assert (config.method, config.beam_size) == ("beam", 4)
    assert config.length_penalty_style == "hf"
    limit = translator.model.max_sequence_length - 1
    assert len(translator.tokenizer.tokenize(batch[2])) > limit
    assert_served_like_translator(served, translator, batch)
