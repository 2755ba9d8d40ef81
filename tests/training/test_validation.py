"""What a fit loop is expected to do: validation loss and token accuracy
every epoch, early stopping on validation BLEU or loss, and the best
epoch's weights kept beside the last checkpoints."""

import csv
import json
import math

import keras
import numpy as np
import pytest

from keras_transformer import data, training
from keras_transformer.generation import Translator, evaluate_bleu
from keras_transformer.training.callbacks import KeepBest
from tests.conftest import MISSING_DATA_REASON, MULTI30K
from tests.helpers import TINY_RECIPE_MODEL
from tests.training.test_run_safety import cli_train, train

# A task a tiny model learns in a few epochs: every English sentence has
# the same translation. Its validation BLEU rises to 100, which nothing
# improves on, so early stopping must end the run.
TARGET = "Ein Hund rennt ."
STEPS_PER_EPOCH = 4
MAX_EPOCHS = 10
PATIENCE = 2
VALIDATION_BATCHES = 2
BLEU_SUBSET = 8
SETTINGS = dict(
    max_steps=MAX_EPOCHS * STEPS_PER_EPOCH,
    steps_per_epoch=STEPS_PER_EPOCH,
    # Every epoch's weights are kept, to compare with the best ones.
    checkpoint_every=STEPS_PER_EPOCH,
    average_last=MAX_EPOCHS,
    vocabulary_size=400,
    max_tokens=512,
    warmup_steps=4,
    learning_rate_scale=0.3,
    bleu_subset=BLEU_SUBSET,
    validation_batches=VALIDATION_BATCHES,
    early_stopping_patience=PATIENCE,
    model={**TINY_RECIPE_MODEL, "dropout": 0.0},
)


@pytest.fixture(scope="module")
def constant_dir(tmp_path_factory):
    """400 training and 40 validation pairs of Multi30k English
    sentences, all translated as ``TARGET``."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"{MISSING_DATA_REASON} {MULTI30K}")
    directory = tmp_path_factory.mktemp("constant")
    for split, count in (("train", 400), ("valid", 40)):
        with open(MULTI30K / f"{split}.en") as f:
            sources = [next(f) for _ in range(count)]
        (directory / f"{split}.en").write_text("".join(sources))
        (directory / f"{split}.de").write_text(f"{TARGET}\n" * count)
    return directory


@pytest.fixture(scope="module")
def stopped_run(constant_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("runs") / "run"
    summary = train(constant_dir, output, **SETTINGS)
    return {"output": output, "summary": summary, "rows": read_log(output)}


def read_log(output):
    with open(output / "logs" / "training.csv") as f:
        return list(csv.DictReader(f))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def epoch_weights(output, epoch):
    """The checkpoint written at the end of ``epoch`` (from 0)."""
    step = (epoch + 1) * STEPS_PER_EPOCH
    return output / "checkpoints" / f"step-{step:08d}.weights.h5"


def weights_of(model, path):
    model.load_weights(path)
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


def test_validation_loss_and_accuracy_are_logged_every_epoch(stopped_run):
    rows = stopped_run["rows"]
    assert [int(row["epoch"]) for row in rows] == list(range(len(rows)))
    for row in rows:
        for key in ("val_loss", "val_token_accuracy", "val_perplexity"):
            assert math.isfinite(float(row[key])), (key, row)
        assert 0.0 <= float(row["val_token_accuracy"]) <= 1.0
    losses = [float(row["val_loss"]) for row in rows]
    accuracies = [float(row["val_token_accuracy"]) for row in rows]
    # The task is learned: the loss falls, every token is right at last.
    assert losses[-1] < losses[0]
    assert accuracies[0] < 1.0 and accuracies[-1] == 1.0


def test_validation_is_teacher_forced_on_the_first_batches(
    stopped_run, constant_dir
):
    """val_loss and val_token_accuracy of an epoch are what `evaluate`
    gives with that epoch's weights on the first ``validation_batches``
    batches of the validation split; all its batches give another
    loss."""
    output = stopped_run["output"]
    translator = Translator.from_pretrained(output)
    model = translator.model
    model.compile(
        loss=training.LabelSmoothedCrossEntropy(0.1),
        metrics=[training.MaskedAccuracy(), training.Perplexity()],
    )
    valid = data.translation_dataset(
        constant_dir / "valid.en",
        constant_dir / "valid.de",
        translator.tokenizer,
        max_tokens=SETTINGS["max_tokens"],
        shuffle=False,
        max_length=128,
    )
    assert valid.planner.num_batches > VALIDATION_BATCHES
    epoch = 1
    model.load_weights(epoch_weights(output, epoch))
    logged = stopped_run["rows"][epoch]
    result = model.evaluate(
        valid.take(VALIDATION_BATCHES), verbose=0, return_dict=True
    )
    np.testing.assert_allclose(
        result["loss"], float(logged["val_loss"]), rtol=1e-5
    )
    np.testing.assert_allclose(
        result["token_accuracy"],
        float(logged["val_token_accuracy"]),
        rtol=1e-5,
    )
    everything = model.evaluate(valid, verbose=0, return_dict=True)
    assert abs(everything["loss"] - result["loss"]) > 1e-4


def test_early_stopping_ends_the_run_when_bleu_stops_improving(stopped_run):
    rows = stopped_run["rows"]
    bleu = [float(row["val_bleu"]) for row in rows]
    best = int(np.argmax(bleu))  # the first of the highest
    # It rose (the first epochs do not translate the task yet) and then
    # did not improve for PATIENCE epochs, after which the run stopped,
    # well before its MAX_EPOCHS.
    assert bleu[0] < bleu[best]
    assert len(rows) == best + 1 + PATIENCE < MAX_EPOCHS
    assert all(value <= bleu[best] for value in bleu[best + 1 :])
    summary = stopped_run["summary"]
    assert summary.stopped_early and not summary.stopped_by_time_limit
    assert summary.steps == len(rows) * STEPS_PER_EPOCH
    results = read_json(stopped_run["output"] / "results.json")
    assert results["monitor"] == "val_bleu"
    assert results["best_epoch"] == best
    assert results["best_value"] == pytest.approx(bleu[best], abs=1e-9)
    assert results["stopped_early"] is True
    assert results["steps"] == summary.steps


def test_the_best_checkpoint_is_the_epoch_of_the_highest_bleu(
    stopped_run, constant_dir
):
    output = stopped_run["output"]
    rows = stopped_run["rows"]
    bleu = [float(row["val_bleu"]) for row in rows]
    best = int(np.argmax(bleu))
    translator = Translator.from_pretrained(output)
    model = translator.model
    best_weights = weights_of(model, output / "checkpoints" / "best.weights.h5")
    for expected, actual in zip(
        weights_of(model, epoch_weights(output, best)),
        best_weights,
        strict=True,
    ):
        np.testing.assert_array_equal(actual, expected)
    # Training went on after the best epoch: the last weights differ.
    last = weights_of(model, epoch_weights(output, len(rows) - 1))
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(last, best_weights, strict=True)
    )
    # Translated again with the best weights, the validation sentences
    # score the logged BLEU (greedy, as during training).
    model.load_weights(output / "checkpoints" / "best.weights.h5")
    with open(constant_dir / "valid.en") as f:
        sources = [next(f).strip() for _ in range(BLEU_SUBSET)]
    result = evaluate_bleu(
        Translator(model, translator.tokenizer, beam_size=1),
        sources,
        [TARGET] * BLEU_SUBSET,
        verbose=False,
    )
    assert result.score == pytest.approx(bleu[best], abs=1e-9)


def test_a_stopped_run_started_again_trains_no_further(
    stopped_run, constant_dir
):
    output = stopped_run["output"]
    before = len(stopped_run["rows"])
    summary = train(constant_dir, output, **SETTINGS)
    assert summary.stopped_early
    assert summary.steps == stopped_run["summary"].steps
    assert summary.best_epoch == stopped_run["summary"].best_epoch
    assert len(read_log(output)) == before


def test_keep_best_stops_after_patience_epochs_without_improvement():
    """`KeepBest` on a loss: the first of equal values stays the best, NaN
    is never the best, and a resumed run goes on from its history."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    losses = [3.0, 2.0, float("nan"), 2.0, 1.5, 1.7, 1.6]
    keep = KeepBest("unused.weights.h5", "val_loss", "min", patience=2)
    keep.set_model(model)
    stopped_at = None
    for epoch, loss in enumerate(losses[:4]):
        model.stop_training = False
        keep.on_epoch_end(epoch, {"val_loss": loss})
        if model.stop_training and stopped_at is None:
            stopped_at = epoch
    assert (keep.best_epoch, keep.best, stopped_at) == (1, 2.0, 3)
    assert keep.stopped_early
    # From the history of the first three epochs: one more epoch without
    # improvement is allowed, then 1.5 is a new best.
    resumed = KeepBest(
        "unused.weights.h5",
        "val_loss",
        "min",
        patience=2,
        history=list(enumerate(losses[:3])),
    )
    assert (resumed.best_epoch, resumed.wait, resumed.exhausted) == (
        1,
        1,
        False,
    )
    with pytest.raises(ValueError, match="'val_bleu', which the epoch logs"):
        KeepBest("unused.weights.h5", "val_bleu", "max").on_epoch_end(0, {})


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"early_stopping_patience": -1}, r"early_stopping_patience=-1 \("),
        ({"early_stopping_patience": "2"}, r"early_stopping_patience='2' \("),
        ({"validation_batches": 1.5}, r"validation_batches=1\.5 \(a float"),
        (
            {
                "early_stopping_patience": 3,
                "bleu_subset": 0,
                "validation_batches": 0,
            },
            r"early_stopping_patience=3 \(an int\) watches a validation "
            r"value, and there is none: set bleu_subset",
        ),
    ],
)
def test_bad_validation_settings_are_named_before_any_work(
    constant_dir, tmp_path, settings, message
):
    output = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        train(constant_dir, output, **settings)
    assert not output.exists()


def test_the_command_names_a_bad_patience_in_one_line(
    constant_dir, tmp_path, capsys
):
    output = tmp_path / "run"
    status = cli_train(
        constant_dir,
        output,
        "--set",
        "early_stopping_patience=-2",
    )
    assert status == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "early_stopping_patience=-2 (an int) must be an integer" in error
    assert not output.exists()
