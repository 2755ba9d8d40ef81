"""One-step smoke tests of each recipe, end to end."""

import json
import os

import pytest

import keras_transformer as kt
from keras_transformer.generation import Translator

TINY = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 32,
    "num_heads": 2,
    "intermediate_dim": 64,
    "dropout": 0.1,
}


def test_multi30k_recipe_trains_saves_and_evaluates(multi30k_dir, tmp_path):
    output = os.path.join(tmp_path, "run")
    summary = kt.training.run_recipe(
        "multi30k_en_de",
        data_dir=multi30k_dir,
        output=output,
        max_steps=4,
        steps_per_epoch=2,
        checkpoint_every=1,
        average_last=2,
        vocabulary_size=600,
        model=TINY,
        max_tokens=512,
        bleu_subset=4,
        test_limit=6,
        verbose=0,
    )
    assert summary.steps == 4
    assert summary.bleu is not None and 0.0 <= summary.bleu <= 100.0
    assert summary.bleu_signature.startswith("nrefs:1")
    with open(os.path.join(output, "results.json")) as f:
        results = json.load(f)
    assert results["averaged_checkpoints"] == [
        "step-00000003.weights.h5",
        "step-00000004.weights.h5",
    ]
    with open(os.path.join(output, "logs", "training.csv")) as f:
        header = f.readline().strip().split(",")
    assert {"loss", "token_accuracy", "perplexity", "val_bleu"} <= set(header)
    # The run directory is a complete translator.
    translator = Translator.from_pretrained(output)
    assert translator.generation_config.beam_size == 4
    assert translator.generation_config.length_penalty == 0.6
    (text,) = translator.translate(["A man rides a bike."], max_length=5)
    assert isinstance(text, str)
    # Started again, the finished run trains no further.
    again = kt.training.run_recipe(
        "multi30k_en_de",
        data_dir=multi30k_dir,
        output=output,
        max_steps=4,
        steps_per_epoch=2,
        checkpoint_every=1,
        average_last=2,
        vocabulary_size=600,
        model=TINY,
        max_tokens=512,
        bleu_subset=0,
        evaluate=False,
        verbose=0,
    )
    assert again.steps == 4


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
