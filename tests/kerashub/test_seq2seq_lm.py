"""The KerasHub task on raw Multi30k text: presets, fit, generate."""

import json

import keras
import keras_hub
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.kerashub import (
    TransformerBackbone,
    TransformerSeq2SeqLM,
    TransformerSeq2SeqLMPreprocessor,
    TransformerTokenizer,
)
from tests.conftest import MULTI30K

TINY = dict(
    num_encoder_layers=1,
    num_decoder_layers=1,
    hidden_dim=32,
    num_heads=2,
    intermediate_dim=64,
    max_sequence_length=64,
)


def _lines(name, count):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    with open(MULTI30K / name, encoding="utf-8") as file:
        return [next(file).rstrip("\n") for _ in range(count)]


@pytest.fixture(scope="module")
def pairs():
    return {
        "train": (_lines("train.en", 2000), _lines("train.de", 2000)),
        "valid": (_lines("valid.en", 200), _lines("valid.de", 200)),
    }


@pytest.fixture(scope="module")
def subword_tokenizer(pairs):
    sources, targets = pairs["train"]
    return kt.data.train_tokenizer(
        sentences=sources + targets, vocabulary_size=500
    )


def _task(subword_tokenizer, dropout=0.0):
    tokenizer = TransformerTokenizer.from_subword_tokenizer(subword_tokenizer)
    preprocessor = TransformerSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=48, decoder_sequence_length=48
    )
    backbone = TransformerBackbone(
        vocabulary_size=subword_tokenizer.vocabulary_size,
        dropout=dropout,
        **TINY,
    )
    return TransformerSeq2SeqLM(backbone, preprocessor)


def test_tokenizer_gives_the_subword_tokenizers_ids(pairs, subword_tokenizer):
    tokenizer = TransformerTokenizer.from_subword_tokenizer(subword_tokenizer)
    sources = pairs["valid"][0][:20] + ["", "Ünïcödé ✓ 42"]
    for sentence in sources:
        ours = [
            int(i) for i in np.asarray(subword_tokenizer.tokenize(sentence))
        ]
        theirs = [int(i) for i in np.asarray(tokenizer.tokenize(sentence))]
        assert theirs == ours, sentence
    assert (
        tokenizer.start_token_id,
        tokenizer.end_token_id,
        tokenizer.pad_token_id,
    ) == (
        subword_tokenizer.start_id,
        subword_tokenizer.end_id,
        subword_tokenizer.pad_id,
    )


def test_preprocessor_lays_out_pairs_as_the_input_pipeline(subword_tokenizer):
    task = _task(subword_tokenizer)
    source, target = "A man rides a bike.", "Ein Mann fährt Rad."
    x, labels, weights = task.preprocessor(
        {"encoder_text": [source], "decoder_text": [target]}
    )
    source_ids = list(np.asarray(subword_tokenizer.tokenize(source)))
    target_ids = list(np.asarray(subword_tokenizer.tokenize(target)))
    start, end = subword_tokenizer.start_id, subword_tokenizer.end_id

    def row(values, length):
        return list(np.asarray(values)[0][:length])

    n, m = len(source_ids), len(target_ids)
    assert row(x["encoder_token_ids"], n + 2) == source_ids + [end, 0]
    assert row(x["encoder_padding_mask"], n + 2) == [1] * (n + 1) + [0]
    assert row(x["decoder_token_ids"], m + 1) == [start] + target_ids
    assert row(labels, m + 2) == target_ids + [end, 0]
    assert row(weights, m + 2) == [1] * (m + 1) + [0]


def test_compile_defaults_are_the_papers(subword_tokenizer):
    task = _task(subword_tokenizer)
    assert isinstance(task.loss, kt.training.LabelSmoothedCrossEntropy)
    assert task.loss.label_smoothing == pytest.approx(0.1)
    optimizer = task.optimizer
    assert (optimizer.beta_1, optimizer.beta_2) == pytest.approx((0.9, 0.98))
    assert optimizer.epsilon == pytest.approx(1e-9)


def test_fit_on_raw_text_lowers_the_validation_loss(pairs, subword_tokenizer):
    keras.utils.set_random_seed(1)
    task = _task(subword_tokenizer)
    sources, targets = pairs["valid"]
    valid = {"encoder_text": sources, "decoder_text": targets}
    untrained, chance = task.evaluate(x=valid, batch_size=50, verbose=0)
    sources, targets = pairs["train"]
    task.fit(
        x={"encoder_text": sources, "decoder_text": targets},
        batch_size=32,
        epochs=4,
        verbose=0,
    )
    trained, accuracy = task.evaluate(x=valid, batch_size=50, verbose=0)
    # 252 steps of the warm-up schedule: well below the untrained loss
    # (ln 500 = 6.2 plus smoothing), and a better token accuracy.
    assert trained < untrained - 0.5, (untrained, trained)
    assert accuracy > chance + 0.02, (chance, accuracy)


def test_preset_round_trip_through_seq2seqlm_from_preset(
    pairs, subword_tokenizer, tmp_path
):
    task = _task(subword_tokenizer)
    task.generation_config = task.generation_config.replace(
        beam_size=3, length_penalty=1.0
    )
    task.save_to_preset(str(tmp_path))
    for name in (
        "config.json",
        "model.weights.h5",
        "preprocessor.json",
        "task.json",
        "tokenizer.json",
        "metadata.json",
    ):
        assert (tmp_path / name).is_file(), name
    assert (
        json.loads((tmp_path / "task.json").read_text())["config"][
            "generation_config"
        ]["beam_size"]
        == 3
    )

    loaded = keras_hub.models.Seq2SeqLM.from_preset(str(tmp_path))
    assert type(loaded) is TransformerSeq2SeqLM
    assert loaded.generation_config == task.generation_config
    for a, b in zip(task.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    sentences = pairs["valid"][0][:5]
    translator = kt.Translator(
        task.backbone, subword_tokenizer, task.generation_config
    )
    expected = translator.translate(sentences, verbose=False)
    assert loaded.generate(sentences) == expected
    # One sentence alone takes another compiled search on TensorFlow.
    single = translator.translate(sentences[0], verbose=False)
    assert loaded.generate(sentences[0]) == single


def test_samplers_map_onto_the_search(pairs, subword_tokenizer):
    task = _task(subword_tokenizer)
    sentences = pairs["valid"][0][:3]
    translator = task.translator()
    task.compile(sampler="greedy")
    assert task.generate(sentences) == translator.translate(
        sentences, method="greedy", verbose=False
    )


@pytest.mark.parametrize(
    "x, message",
    [
        ({"encoder_text": ["a"]}, "no 'decoder_text' key"),
        (
            {"encoder_text": ["a", "b"], "decoder_text": ["c", 7]},
            r"x\['decoder_text'\]\[1\] is int 7",
        ),
        (
            {"encoder_text": ["a", "b"], "decoder_text": ["c"]},
            "has 2 sentences and x\\['decoder_text'\\] 1",
        ),
    ],
)
def test_bad_text_pairs_are_refused_in_one_line(subword_tokenizer, x, message):
    task = _task(subword_tokenizer)
    with pytest.raises(ValueError, match=message) as error:
        task.fit(x=x, batch_size=2, epochs=1, verbose=0)
    assert "\n" not in str(error.value)


def test_from_preset_after_importing_the_package(subword_tokenizer, tmp_path):
    """In a fresh process, ``import keras_transformer`` then KerasHub's
    loader: the classes are registered when keras_hub is imported."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    _task(subword_tokenizer).save_to_preset(str(tmp_path))
    code = (
        "import keras_transformer, keras_hub\n"
        f"task = keras_hub.models.Seq2SeqLM.from_preset({str(tmp_path)!r})\n"
        "print(type(task).__module__, type(task).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == [
        "keras_transformer.kerashub.seq2seq_lm",
        "TransformerSeq2SeqLM",
    ]
