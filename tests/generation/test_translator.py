"""`Translator`: batching, bad inputs, saving, BLEU."""

import json
import os
import shutil

import numpy as np
import pytest
import sacrebleu

from keras_transformer.generation import (
    GenerationConfig,
    Translator,
    corpus_bleu,
    evaluate_bleu,
)
from tests.generation.conftest import SENTENCES, build_tiny_model


def test_translate_restores_order_across_batches(translator):
    # 6 sentences of different lengths, batches of 2 sorted by length.
    forward = translator.translate(SENTENCES)
    backward = translator.translate(SENTENCES[::-1])
    assert len(forward) == len(SENTENCES)
    assert all(isinstance(t, str) and t for t in forward)
    assert backward[::-1] == forward
    assert len(set(forward)) > 1


def test_single_string_gives_single_string(translator):
    text = translator.translate(SENTENCES[4])
    assert isinstance(text, str)
    assert text == translator.translate(SENTENCES[4:5])[0]


def test_empty_sentences_translate_to_empty_strings(translator):
    assert translator.translate("") == ""
    result = translator.translate(["", "   ", SENTENCES[4]])
    assert result[:2] == ["", ""]
    assert result[2] == translator.translate(SENTENCES[4])


def test_over_long_sentences(translator):
    # max_sequence_length=8: at most 7 subword tokens plus the end token.
    long = " ".join(SENTENCES * 3)
    assert len(translator.tokenizer.tokenize([long]).to_list()[0]) > 7
    with pytest.warns(UserWarning, match="truncated to 7 tokens"):
        result = translator.translate([long, SENTENCES[0]])
    assert isinstance(result[0], str) and result[0]
    with pytest.raises(ValueError, match='long_inputs="truncate"'):
        translator.translate([SENTENCES[0], long], long_inputs="error")


@pytest.mark.parametrize(
    "bad", [[1], [SENTENCES[0], None], [b"a man"], 7, None]
)
def test_non_strings_raise_type_error(translator, bad):
    with pytest.raises(TypeError, match="str"):
        translator.translate(bad)


def test_n_best_and_scores(translator):
    results = translator.translate_with_scores(
        SENTENCES[:2], num_return_sequences=3
    )
    for hypotheses in results:
        assert len(hypotheses) == 3
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert all(np.isfinite(scores))
    texts = translator.translate(SENTENCES[:2], num_return_sequences=3)
    assert [[h.text for h in r] for r in results] == texts


def test_progress_bar_on_long_inputs(translator, capsys):
    translator.translate(SENTENCES[:2])  # one batch: no bar
    assert capsys.readouterr().out == ""
    translator.translate(SENTENCES)  # three batches of 2
    assert "6/6" in capsys.readouterr().out


def test_settings_are_checked(translator):
    with pytest.raises(TypeError, match="beam_width"):
        translator.translate(SENTENCES[:1], beam_width=4)
    with pytest.raises(ValueError, match="method='nucleus'"):
        GenerationConfig(method="nucleus")
    with pytest.raises(ValueError, match="num_return_sequences=5"):
        GenerationConfig(beam_size=4, num_return_sequences=5)
    with pytest.raises(ValueError, match="Greedy search returns one"):
        translator.translate(
            SENTENCES[:1], method="greedy", num_return_sequences=2
        )


USUAL = {
    "length_penalty": "0.6 in the paper; 0 disables it",
    "temperature": "1 leaves the probabilities as they are",
    "top_p": "1 disables the filter",
}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", sorted(USUAL))
def test_non_finite_settings_are_refused_where_they_are_set(
    translator, saved_translator, tmp_path, name, value
):
    message = f"{name}={value} must be a finite number ({USUAL[name]})."
    setting = {name: value}
    model, tokenizer = translator.model, translator.tokenizer
    before = translator.generation_config.to_dict()
    for make in (
        lambda: GenerationConfig(**setting),
        lambda: GenerationConfig().replace(**setting),
        lambda: GenerationConfig.from_dict(setting),
        lambda: Translator(model, tokenizer, **setting),
        lambda: translator.translate(SENTENCES[:1], **setting),
        lambda: Translator.from_pretrained(saved_translator, **setting),
        # Before anything is read: there is no translator there.
        lambda: Translator.from_pretrained(tmp_path / "none", **setting),
    ):
        with pytest.raises(ValueError) as caught:
            make()
        assert str(caught.value) == message
    # Finite values pass; the refused call left the translator as it was.
    assert getattr(GenerationConfig(**{name: 0.5}), name) == 0.5
    assert translator.generation_config.to_dict() == before


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(translator):
    tokenizer = translator.tokenizer
    size = tokenizer.vocabulary_size
    for model in (
        build_tiny_model(vocabulary_size=size - 1),
        # A separate target vocabulary is the one generated ids index.
        build_tiny_model(
            vocabulary_size=size + 10, target_vocabulary_size=size - 3
        ),
    ):
        smaller = model.target_vocabulary_size or model.vocabulary_size
        with pytest.raises(ValueError) as caught:
            Translator(model, tokenizer)
        assert str(caught.value) == (
            f"The tokenizer has {size} ids but the model's vocabulary_size "
            f"is {smaller}. Use the tokenizer the model was trained with."
        )
    # A model with as many ids, or more, takes the tokenizer.
    for extra in (0, 5):
        model = build_tiny_model(vocabulary_size=size + extra)
        assert Translator(model, tokenizer).tokenizer is tokenizer


def test_save_and_load(translator, saved_translator):
    # KerasHub's preset layout.
    names = sorted(os.listdir(saved_translator))
    assert names == [
        "assets",
        "config.json",
        "metadata.json",
        "model.weights.h5",
        "preprocessor.json",
        "task.json",
        "tokenizer.json",
    ]
    assert os.listdir(saved_translator / "assets" / "tokenizer") == [
        "vocabulary.spm"
    ]
    metadata = json.loads((saved_translator / "metadata.json").read_text())
    assert metadata["keras_transformer"]["format_version"] == 2
    assert metadata["keras_transformer"]["quantization"] is None
    task = json.loads((saved_translator / "task.json").read_text())
    assert task["config"]["generation_config"] == (
        translator.generation_config.to_dict()
    )
    loaded = Translator.from_pretrained(saved_translator)
    assert loaded.generation_config == translator.generation_config
    assert loaded.tokenizer.proto == translator.tokenizer.proto
    assert loaded.translate(SENTENCES) == translator.translate(SENTENCES)
    overridden = Translator.from_pretrained(saved_translator, beam_size=2)
    assert overridden.generation_config.beam_size == 2


def test_version_1_directories_still_load(translator, saved_version_1):
    loaded = Translator.from_pretrained(saved_version_1)
    assert loaded.generation_config == translator.generation_config
    assert loaded.translate(SENTENCES) == translator.translate(SENTENCES)
    for expected, actual in zip(
        translator.model.get_weights(), loaded.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(actual, expected)


def test_saving_over_version_1_leaves_no_stale_settings(
    translator, saved_version_1, tmp_path
):
    directory = tmp_path / "resaved"
    shutil.copytree(saved_version_1, directory)
    Translator(translator.model, translator.tokenizer, beam_size=3).save(
        directory
    )
    assert not (directory / "generation_config.json").exists()
    loaded = Translator.from_pretrained(directory)
    assert loaded.generation_config.beam_size == 3


def test_load_errors(saved_translator, tmp_path):
    with pytest.raises(FileNotFoundError, match="Translator.save"):
        Translator.from_pretrained(tmp_path / "nothing")
    broken = tmp_path / "broken"
    shutil.copytree(saved_translator, broken)
    metadata = json.loads((broken / "metadata.json").read_text())
    metadata["keras_transformer"]["format_version"] = 99
    (broken / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match="format_version=99"):
        Translator.from_pretrained(broken)
    (broken / "model.weights.h5").unlink()
    with pytest.raises(FileNotFoundError, match="model.weights.h5"):
        Translator.from_pretrained(broken)


def test_evaluate_bleu(translator):
    references = SENTENCES[::-1]
    result = evaluate_bleu(translator, SENTENCES, references)
    hypotheses = translator.translate(SENTENCES)
    assert result.hypotheses == hypotheses
    expected = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references])
    assert result.score == pytest.approx(expected.score)
    assert "nrefs:1" in result.signature and "tok:13a" in result.signature
    assert str(result).startswith("BLEU = ")
    # Known values: identical text scores 100, disjoint text 0.
    assert corpus_bleu(SENTENCES, SENTENCES).score == pytest.approx(100.0)
    assert corpus_bleu(["xx yy zz ww"], ["a b c d"]).score == 0.0
    two_references = corpus_bleu(SENTENCES, [references, SENTENCES])
    assert two_references.score == pytest.approx(100.0)
    assert "nrefs:2" in two_references.signature
    with pytest.raises(ValueError, match="align"):
        evaluate_bleu(translator, SENTENCES, references[:-1])
