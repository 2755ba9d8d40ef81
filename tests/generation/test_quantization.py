"""`Translator.quantize("int8")`: int8 kernels that stay int8 through
`save` and `from_pretrained`, translations close to the float model's,
and clear errors.

The translator is the session's tiny model trained to reverse token
sequences (tests/generation/conftest.py), copied so that quantizing it
leaves the shared model alone, with a SentencePiece tokenizer of one
piece per letter: its 12 pieces are exactly the model's ids 4 to 15, so
a sentence of letters is a token sequence the model learned to reverse.
"""

import json
import shutil

import h5py
import keras
import numpy as np
import pytest

from keras_transformer.generation import Translator, corpus_bleu
from keras_transformer.generation.quantization import (
    quantize_model,
    quantized_embeddings,
)
from tests.generation.conftest import (
    TRAINED_MAX_LENGTH,
    VOCABULARY_SIZE,
    build_tiny_model,
)

LETTERS = "abcdefghijk"  # with the word-start piece: 12 pieces, ids 4-15


def _sentences(count=20, seed=0):
    """Words of 1 to 6 letters: with the word-start piece, 2 to 7
    tokens, the lengths the model was trained on."""
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(list(LETTERS), rng.integers(1, 7)))
        for _ in range(count)
    ]


SENTENCES = _sentences()


@pytest.fixture(scope="module")
def letter_tokenizer():
    from keras_transformer.data import train_tokenizer

    tokenizer = train_tokenizer(
        sentences=[LETTERS, *SENTENCES] * 4,
        vocabulary_size=VOCABULARY_SIZE,
        byte_fallback=False,
    )
    ids = tokenizer.tokenize([LETTERS])
    ids = ids.to_list() if hasattr(ids, "to_list") else ids
    assert sorted(int(i) for i in ids[0]) == list(range(4, 16))
    return tokenizer


def _translator(trained_model, tokenizer):
    model = build_tiny_model(seed=1)
    model.set_weights(trained_model.get_weights())
    return Translator(
        model,
        tokenizer,
        method="greedy",
        max_length=TRAINED_MAX_LENGTH,
        batch_size=32,
    )


def _scores(results):
    return np.array([row[0].score for row in results])


@pytest.fixture(scope="module")
def quantized(trained_model, letter_tokenizer, tmp_path_factory):
    """The float translator's results, then the same translator
    quantized (compiled searches of the float model run before) and
    saved: ``(translator, float_results, float_generator, directory)``."""
    translator = _translator(trained_model, letter_tokenizer)
    float_results = translator.translate_with_scores(SENTENCES)
    float_generator = translator.generator
    assert translator.quantize("int8") is translator
    directory = tmp_path_factory.mktemp("int8_translator")
    translator.save(directory)
    return translator, float_results, float_generator, directory


def _weights(model):
    """``{path: numpy array}`` of a model's variables."""
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def _assert_int8_kernels(model, embeddings=True):
    """Every kernel is int8, each with a float32 scale per output unit,
    and the shared embedding int8 with a scale per token (or float32,
    with ``embeddings`` false)."""
    weights = _weights(model)
    kernels = {p: w for p, w in weights.items() if p.endswith("/kernel")}
    # 1 encoder and 1 decoder layer: 4 + 4 + 4 attention projections and
    # 2 + 2 feed-forward matrices.
    assert len(kernels) == 16
    for path, kernel in kernels.items():
        assert kernel.dtype == np.int8, path
        assert np.abs(kernel).max() == 127, path  # abs-max scaling
        assert weights[f"{path}_scale"].dtype == np.float32, path
    embedding = weights["token_embedding/embeddings"]
    if not embeddings:
        assert embedding.dtype == np.float32
        assert "token_embedding/embeddings_scale" not in weights
        return kernels
    scale = weights["token_embedding/embeddings_scale"]
    assert embedding.dtype == np.int8
    assert scale.dtype == np.float32 and scale.shape == embedding.shape[:1]
    # Abs-max per token: every row reaches 127 or -127.
    np.testing.assert_array_equal(np.abs(embedding).max(axis=1), 127)
    return kernels


def test_quantize_makes_int8_kernels_and_a_new_search(quantized):
    translator, float_results, float_generator, _ = quantized
    assert translator.quantization_mode == "int8"
    _assert_int8_kernels(translator.model)
    # The float model's compiled searches are gone with its generator:
    # the quantized model's scores are not the float model's.
    assert translator.generator is not float_generator
    assert translator.generator.model is translator.model
    int8_results = translator.translate_with_scores(SENTENCES)
    assert not np.allclose(
        _scores(int8_results), _scores(float_results), rtol=0, atol=1e-6
    )


def test_int8_weights_are_saved_and_loaded_as_int8(quantized):
    translator, _, _, directory = quantized
    metadata = json.loads((directory / "metadata.json").read_text())
    assert metadata["keras_transformer"]["quantization"] == "int8"
    assert metadata["keras_transformer"]["format_version"] == 2
    kernels = _assert_int8_kernels(translator.model)
    with h5py.File(directory / "model.weights.h5", "r") as f:
        stored = []
        f.visititems(
            lambda name, item: (
                stored.append(item.dtype)
                if isinstance(item, h5py.Dataset)
                else None
            )
        )
    assert sum(dtype == np.int8 for dtype in stored) == len(kernels) + 1
    assert metadata["keras_transformer"]["quantized_embeddings"] is True

    loaded = Translator.from_pretrained(directory)
    assert loaded.quantization_mode == "int8"
    _assert_int8_kernels(loaded.model)
    expected, actual = _weights(translator.model), _weights(loaded.model)
    assert actual.keys() == expected.keys()
    for path, value in expected.items():
        assert actual[path].dtype == value.dtype, path
        np.testing.assert_array_equal(actual[path], value, err_msg=path)
    want = translator.translate_with_scores(SENTENCES)
    got = loaded.translate_with_scores(SENTENCES)
    assert [r[0].text for r in got] == [r[0].text for r in want]
    np.testing.assert_allclose(_scores(got), _scores(want), atol=1e-5)


def test_int8_translations_match_float_ones(quantized):
    translator, float_results, _, _ = quantized
    float_texts = [row[0].text for row in float_results]
    int8_texts = translator.translate(SENTENCES)
    # The model learned the task, if not perfectly: a fair share of the
    # float translations are exactly right (a quarter on torch).
    reversed_words = [s[::-1] for s in SENTENCES]
    right = np.mean(
        [
            t.strip() == r
            for t, r in zip(float_texts, reversed_words, strict=True)
        ]
    )
    assert right >= 0.15
    # int8 rounding moves each logit by far less than the margin between
    # a trained model's best and second token, so greedy choices rarely
    # change: 20 of 20 translations match on TensorFlow, JAX and torch.
    # 0.8 leaves room for a near tie or two (int8 matrix products round
    # differently per backend) and still fails a broken quantization,
    # which gets almost none right.
    same = np.mean(
        [a == b for a, b in zip(int8_texts, float_texts, strict=True)]
    )
    assert same >= 0.8


def test_quantize_errors_name_the_value(
    quantized, trained_model, letter_tokenizer
):
    translator, *_ = quantized
    with pytest.raises(ValueError, match="already quantized") as error:
        translator.quantize("int8")
    assert "'int8'" in str(error.value) and "\n" not in str(error.value)
    fresh = _translator(trained_model, letter_tokenizer)
    for mode in ("int3", "float8", None):
        with pytest.raises(ValueError, match=f"mode={mode!r}") as error:
            fresh.quantize(mode)
        assert "('int8',)" in str(error.value)
        assert "\n" not in str(error.value)
    # Refused before any work: the model is still float.
    assert fresh.quantization_mode is None
    assert all(w.dtype == "float32" for w in fresh.model.weights)


def test_int8_directories_with_a_float_embedding_load_as_saved(
    trained_model, letter_tokenizer, tmp_path
):
    """Translators quantized before the token embedding had an int8 form
    hold it in float32, and their metadata has no
    ``quantized_embeddings``: they load (and save again) as they were."""
    translator = _translator(trained_model, letter_tokenizer)
    quantize_model(translator.model, "int8", embeddings=False)
    assert not quantized_embeddings(translator.model)
    translator.save(tmp_path / "saved")
    path = tmp_path / "saved" / "metadata.json"
    metadata = json.loads(path.read_text())
    assert metadata["keras_transformer"].pop("quantized_embeddings") is False
    path.write_text(json.dumps(metadata))

    loaded = Translator.from_pretrained(tmp_path / "saved")
    assert loaded.quantization_mode == "int8"
    _assert_int8_kernels(loaded.model, embeddings=False)
    for path, value in _weights(translator.model).items():
        np.testing.assert_array_equal(
            _weights(loaded.model)[path], value, err_msg=path
        )
    assert loaded.translate(SENTENCES) == translator.translate(SENTENCES)
    loaded.save(tmp_path / "again")
    again = Translator.from_pretrained(tmp_path / "again")
    _assert_int8_kernels(again.model, embeddings=False)


@pytest.fixture(scope="module")
def float_directory(trained_model, letter_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("float_translator")
    _translator(trained_model, letter_tokenizer).save(directory)
    return directory


def test_float_directories_load_as_float(float_directory, quantized, tmp_path):
    """A directory without a quantization (every one saved before int8)
    holds float weights; an unknown mode in it is refused by name."""
    metadata = json.loads((float_directory / "metadata.json").read_text())
    assert metadata["keras_transformer"]["quantization"] is None
    loaded = Translator.from_pretrained(float_directory)
    assert loaded.quantization_mode is None
    assert all(w.dtype == "float32" for w in loaded.model.weights)

    _, _, _, directory = quantized
    broken = tmp_path / "int4"
    shutil.copytree(directory, broken)
    metadata = json.loads((broken / "metadata.json").read_text())
    metadata["keras_transformer"]["quantization"] = "int4"
    (broken / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match="quantization='int4'"):
        Translator.from_pretrained(broken)


def test_quantization_benchmark_smoke(float_directory, quantized, tmp_path):
    """`benchmarks.quantization` on the letter translator: BLEU of both
    against the reversed words, agreement and speed rows."""
    from benchmarks import quantization

    source, reference = tmp_path / "source.txt", tmp_path / "reference.txt"
    source.write_text("\n".join(SENTENCES) + "\n")
    reference.write_text("\n".join(s[::-1] for s in SENTENCES) + "\n")
    output = tmp_path / "quantization.json"
    report = quantization.main(
        [
            "--model",
            str(float_directory),
            "--source",
            str(source),
            "--reference",
            str(reference),
            "--method",
            "greedy",
            "--rounds",
            "1",
            "--threads",
            "0",
            "--output",
            str(output),
        ]
    )
    assert json.loads(output.read_text())["backend"] == keras.backend.backend()
    assert report["sentences"] == len(SENTENCES)
    # The float translations are those of the fixture's translator.
    _, float_results, _, _ = quantized
    bleu = report["bleu"]
    expected = corpus_bleu(
        [row[0].text for row in float_results],
        [s[::-1] for s in SENTENCES],
    )
    assert bleu["float32"]["bleu"] == round(expected.score, 2)
    assert report["identical_translations"] >= 0.8
    assert 0 <= bleu["int8"]["bleu"] <= 100
    assert bleu["float32"]["bleu"] - bleu["int8"]["bleu"] == pytest.approx(
        report["bleu_drop"], abs=0.011
    )
    assert (
        bleu["int8"]["weights_file_bytes"]
        < bleu["float32"]["weights_file_bytes"]
    )
    levels = [row["level"] for row in report["speed"]]
    assert levels == [f"{len(SENTENCES)} sentences", "1 sentence"]
    for row in report["speed"]:
        assert row["sentences_per_s"]["int8"] > 0
