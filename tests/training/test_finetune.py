"""Fine-tuning: ``keras-transformer train --init MODEL`` starts from a
trained model (here a random Marian checkpoint built locally and
converted, as the Marian tests build it) and keeps its tokenizer and
shape; the result goes to a Hub and comes back the same."""

import csv
import json
import re

import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import cli, data, marian, training
from tests.conftest import MISSING_DATA_REASON, MULTI30K
from tests.helpers import set_arguments
from tests.marian.conftest import read_lines, write_checkpoint
from tests.marian.test_marian import hub  # noqa: F401 (a fixture)
from tests.training.test_run_safety import copy_multi30k

RECIPE = "multi30k_en_de_finetune"
SETTINGS = dict(
    steps_per_epoch=4,
    checkpoint_every=4,
    max_tokens=512,
    bleu_subset=4,
    validation_batches=1,
    # A random model has much to learn: a higher peak than the recipe's
    # shows it in 8 steps.
    peak_learning_rate=1e-3,
)
STEPS = 8


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"{MISSING_DATA_REASON} {MULTI30K}")
    root = tmp_path_factory.mktemp("data")
    return copy_multi30k(root / "multi30k", {"train": 200, "valid": 20})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, data_dir):
    """A random MarianMTModel with its SentencePiece tokenizer, saved as
    a Hugging Face checkpoint directory."""
    pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("marian") / "opus-mt-tiny"
    write_checkpoint(str(directory), MULTI30K)
    return directory


@pytest.fixture(scope="module")
def sentences():
    return {
        "sources": read_lines(MULTI30K, "test.en", 6, max_words=9),
        "targets": read_lines(MULTI30K, "test.de", 6, max_words=9),
    }


def training_loss(translator, data_dir):
    """The label-smoothed loss of the translator's model on the first
    four training batches, in corpus order (dropout off)."""
    model = translator.model
    pad = {"pad_id": translator.tokenizer.pad_id}
    model.compile(loss=training.LabelSmoothedCrossEntropy(0.1, **pad))
    batches = data.translation_dataset(
        data_dir / "train.en",
        data_dir / "train.de",
        translator.tokenizer,
        max_tokens=SETTINGS["max_tokens"],
        shuffle=False,
        max_length=64,
    ).take(4)
    return model.evaluate(batches, verbose=0, return_dict=True)["loss"]


def token_ids(tokenizer, sentences):
    return (
        tokenizer.tokenize(sentences["sources"]),
        tokenizer.tokenize_target(sentences["targets"]),
    )


def test_target_ids_are_the_labels_transformers_gives(checkpoint, sentences):
    """The labels of fine-tuning are split by the target SentencePiece
    model, as ``transformers``' ``tokenizer(text_target=...)`` splits
    them (which ends each row with the end id)."""
    import transformers

    saved = transformers.MarianTokenizer.from_pretrained(str(checkpoint))
    expected = saved(text_target=sentences["targets"])["input_ids"]
    tokenizer = kt.Translator.from_pretrained(checkpoint).tokenizer
    assert [
        row + [tokenizer.end_id] for row in token_ids(tokenizer, sentences)[1]
    ] == expected
    # The source model splits German otherwise.
    assert tokenizer.tokenize(sentences["targets"]) != (
        tokenizer.tokenize_target(sentences["targets"])
    )


@pytest.fixture(scope="module")
def fine_tuned(checkpoint, data_dir, sentences, tmp_path_factory):
    """The converted checkpoint's loss and ids, then `keras-transformer
    train --init` of it for ``STEPS`` steps."""
    before = kt.Translator.from_pretrained(checkpoint)
    measured = {
        "loss": training_loss(before, data_dir),
        "ids": token_ids(before.tokenizer, sentences),
        "config": before.model.get_config(),
        "generation": before.generation_config,
    }
    output = tmp_path_factory.mktemp("runs") / "fine-tuned"
    status = cli.main(
        [
            "train",
            "--recipe",
            RECIPE,
            "--init",
            str(checkpoint),
            "--data-dir",
            str(data_dir),
            "--output",
            str(output),
            "--max-steps",
            str(STEPS),
            "--no-evaluate",
            "--quiet",
            *set_arguments(SETTINGS),
        ]
    )
    assert status == 0
    return {"before": measured, "output": output}


def test_fine_tuning_keeps_the_tokenizer_and_lowers_the_loss(
    fine_tuned, checkpoint, data_dir, sentences
):
    before, output = fine_tuned["before"], fine_tuned["output"]
    after = kt.Translator.from_pretrained(output)
    assert isinstance(after.tokenizer, marian.MarianTokenizer)
    assert token_ids(after.tokenizer, sentences) == before["ids"]
    # The same model, other weights: lower loss on the training batches.
    config = after.model.get_config()
    assert {**config, "name": None} == {**before["config"], "name": None}
    loss = training_loss(after, data_dir)
    assert loss < before["loss"] - 0.1, (loss, before["loss"])
    # The loaded model's generation settings are kept.
    assert after.generation_config == before["generation"]
    with open(output / "results.json") as f:
        results = json.load(f)
    assert results["steps"] == STEPS
    assert results["init"] == str(checkpoint)
    settings = results["recipe_settings"]
    assert settings["vocabulary_size"] == config["vocabulary_size"]
    assert settings["max_length"] == config["max_sequence_length"] == 64
    assert settings["model"]["hidden_dim"] == 32
    assert settings["model"]["activation"] == config["activation"]
    # The rate logged after the first epoch (step 5 counting from 1) is
    # peak_learning_rate, reached at the end of the warm-up, decayed as
    # the inverse square root of the step (section 5.3) and cooled down.
    with open(output / "logs" / "training.csv") as f:
        rate = float(next(csv.DictReader(f))["learning_rate"])
    warmup, cooldown = settings["warmup_steps"], settings["cooldown_steps"]
    step = SETTINGS["steps_per_epoch"] + 1
    expected = SETTINGS["peak_learning_rate"] * (warmup / step) ** 0.5
    expected *= min(1.0, (STEPS + 1 - step) / cooldown)
    assert rate == pytest.approx(expected, rel=1e-5)


def test_the_fine_tuned_model_goes_to_the_hub_and_back(
    fine_tuned,
    sentences,
    hub,  # noqa: F811
):
    translator = kt.Translator.from_pretrained(fine_tuned["output"])
    repo = f"{hub['user']}/opus-mt-tiny-fine-tuned"
    translator.push_to_hub(repo, token=hub["token"])
    pulled = kt.Translator.from_pretrained(f"hf://{repo}")
    assert token_ids(pulled.tokenizer, sentences) == (
        token_ids(translator.tokenizer, sentences)
    )
    for a, b in zip(
        pulled.model.get_weights(), translator.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert pulled.generation_config == translator.generation_config
    translations = translator.translate(sentences["sources"], max_length=12)
    assert pulled.translate(sentences["sources"], max_length=12) == (
        translations
    )


@pytest.mark.parametrize(
    "recipe, settings, message",
    [
        (
            RECIPE,
            {"model.hidden_dim": 64},
            r"Recipe setting model\.hidden_dim=64 \(an int\) contradicts the "
            r"model of init=.*whose value is 32 \(an int\)",
        ),
        (
            "multi30k_en_de",
            {"vocabulary_size": 8000},
            r"vocabulary_size=8000 \(an int\) contradicts .* drop the setting",
        ),
        (RECIPE, {"max_length": 100}, r"max_length=100 .* is 64 .* at most"),
    ],
)
def test_settings_that_contradict_the_loaded_model_are_refused(
    checkpoint, data_dir, tmp_path, capsys, recipe, settings, message
):
    output = tmp_path / "run"
    status = cli.main(
        [
            "train",
            "--recipe",
            recipe,
            "--init",
            str(checkpoint),
            "--data-dir",
            str(data_dir),
            "--output",
            str(output),
            "--no-evaluate",
            *set_arguments(settings),
        ]
    )
    assert status == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert re.search(message, error), error
    assert not output.exists()


def test_fine_tuning_needs_a_model_and_the_dropout_may_change(
    checkpoint, data_dir, tmp_path
):
    output = tmp_path / "run"
    with pytest.raises(ValueError, match=r"fine-tunes a trained model: pass"):
        training.run_recipe(RECIPE, data_dir=data_dir, output=output)
    with pytest.raises(FileNotFoundError, match=r"init='.*missing' is not a"):
        training.run_recipe(
            RECIPE, data_dir=data_dir, output=output, init=tmp_path / "missing"
        )
    assert not output.exists()
    # A from-scratch recipe with init: the model's settings are the
    # loaded model's; a dropout rate is the one setting that may differ.
    summary = training.run_recipe(
        "multi30k_en_de",
        data_dir=data_dir,
        output=output,
        init=checkpoint,
        max_steps=1,
        steps_per_epoch=1,
        max_tokens=512,
        bleu_subset=0,
        validation_batches=0,
        evaluate=False,
        verbose=0,
        model={"dropout": 0.3, "hidden_dim": 32},
    )
    assert summary.steps == 1 and summary.init == str(checkpoint)
    model = kt.Translator.from_pretrained(output).model
    assert model.dropout == 0.3 and model.hidden_dim == 32
