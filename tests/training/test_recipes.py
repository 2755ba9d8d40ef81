"""One-step smoke tests of each recipe, end to end."""

import json
import os

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import cli, training
from keras_transformer.generation import Translator
from tests.conftest import MULTI30K
from tests.helpers import (
    TINY_RECIPE_MODEL,
    set_arguments,
    tiny_recipe_settings,
)


@pytest.fixture(scope="module")
def multi30k_run(tmp_path_factory):
    """One tiny run of the multi30k recipe through `keras-transformer
    train`, shared by the tests below."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    output = str(tmp_path_factory.mktemp("run"))
    status = cli.main(
        [
            "train",
            "--recipe",
            "multi30k_en_de",
            "--data-dir",
            str(MULTI30K),
            "--output",
            output,
            "--max-steps",
            "4",
            "--test-limit",
            "6",
            "--quiet",
            *SMALL,
        ]
    )
    assert status == 0
    return output


SMALL = set_arguments(tiny_recipe_settings(bleu_subset=4))


def test_train_command_saves_results_logs_and_a_translator(multi30k_run):
    with open(os.path.join(multi30k_run, "results.json")) as f:
        results = json.load(f)
    assert results["steps"] == 4
    assert 0.0 <= results["bleu"] <= 100.0
    assert results["bleu_signature"].startswith("nrefs:1")
    assert results["parameters"] > 0
    assert results["averaged_checkpoints"] == [
        "step-00000003.weights.h5",
        "step-00000004.weights.h5",
    ]
    assert results["recipe_settings"]["model"] == TINY_RECIPE_MODEL
    with open(os.path.join(multi30k_run, "logs", "training.csv")) as f:
        header = f.readline().strip().split(",")
    assert {"loss", "token_accuracy", "perplexity", "val_bleu"} <= set(header)
    # The run directory is a complete translator.
    translator = Translator.from_pretrained(multi30k_run)
    assert translator.generation_config.beam_size == 4
    recipe = training.get_recipe("multi30k_en_de")
    assert translator.generation_config.length_penalty == recipe.length_penalty
    (text,) = translator.translate(["A man rides a bike."], max_length=5)
    assert isinstance(text, str)


def test_a_finished_run_started_again_trains_no_further(multi30k_run):
    summary = kt.training.run_recipe(
        "multi30k_en_de",
        data_dir=MULTI30K,
        output=multi30k_run,
        max_steps=4,
        steps_per_epoch=2,
        checkpoint_every=1,
        average_last=2,
        vocabulary_size=600,
        model=TINY_RECIPE_MODEL,
        max_tokens=512,
        bleu_subset=0,
        evaluate=False,
        verbose=0,
    )
    assert summary.steps == 4
    assert "steps:       4" in str(summary)


def test_evaluate_and_average_commands(multi30k_run, tmp_path, capsys):
    assert (
        cli.main(
            [
                "evaluate",
                "--model",
                multi30k_run,
                "--data-dir",
                str(MULTI30K),
                "--limit",
                "3",
                "--beam-size",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "BLEU" in out and "nrefs:1" in out and "(3 sentences)" in out

    averaged = os.path.join(tmp_path, "averaged")
    assert (
        cli.main(
            [
                "average",
                "--model",
                multi30k_run,
                "--output",
                averaged,
                "--last",
                "2",
            ]
        )
        == 0
    )
    checkpoints = training.list_checkpoints(
        os.path.join(multi30k_run, "checkpoints")
    )
    model = Translator.from_pretrained(multi30k_run).model
    training.average_checkpoints(model, checkpoints[-2:])
    loaded = Translator.from_pretrained(averaged).model
    for a, b in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)
        )


def small_wmt_directory(multi30k_dir, directory):
    """A WMT14-shaped local directory made of a few Multi30k lines."""
    os.makedirs(directory)
    for language in ("en", "de"):
        with open(os.path.join(multi30k_dir, f"train.{language}")) as f:
            lines = [next(f) for _ in range(300)]
        for split, part in (
            ("train", lines[:250]),
            ("newstest2013", lines[250:275]),
            ("newstest2014", lines[275:]),
        ):
            with open(os.path.join(directory, f"{split}.{language}"), "w") as f:
                f.writelines(part)
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wmt14_en_de_base", "wmt14_en_de_big"])
def test_wmt14_recipes_run_a_step(name, multi30k_dir, tmp_path):
    """The paper's models and hyperparameters, one small step on CPU."""
    recipe = kt.training.get_recipe(name)
    data_dir = small_wmt_directory(multi30k_dir, os.path.join(tmp_path, "d"))
    summary = kt.training.run_recipe(
        name,
        data_dir=data_dir,
        output=os.path.join(tmp_path, "run"),
        max_steps=1,
        steps_per_epoch=1,
        vocabulary_size=400,
        max_tokens=256,
        bleu_subset=0,
        validation_batches=1,
        evaluate=False,
        verbose=0,
    )
    assert summary.steps == 1
    config = Translator.from_pretrained(os.path.join(tmp_path, "run")).model
    assert config.hidden_dim == recipe.model["hidden_dim"]
    assert config.num_encoder_layers == 6


def test_unknown_recipe_and_setting():
    with pytest.raises(ValueError, match="'wmt99'.*multi30k_en_de"):
        kt.training.get_recipe("wmt99")
    with pytest.raises(ValueError, match="learning_rat"):
        kt.training.get_recipe("multi30k_en_de", learning_rat=1.0)
