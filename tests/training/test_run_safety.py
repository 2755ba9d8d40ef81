"""`run_recipe` and `keras-transformer train` never clobber an output
directory, check everything before any work, leave the output as they
found it when a run fails to start, fit the schedule to short runs and
say where a run interrupted by Ctrl-C resumes."""

import csv
import hashlib
import json
import os
import pathlib
import shutil
import signal

import keras
import numpy as np
import pytest

from keras_transformer import cli, training
from keras_transformer.generation import Translator
from keras_transformer.training.run_directory import RUN_FILE, check_output
from tests.conftest import MISSING_DATA_REASON, MULTI30K
from tests.helpers import (
    TINY_RECIPE_MODEL,
    set_arguments,
    tiny_recipe_settings,
)

RECIPE = "multi30k_en_de"
SMALL = tiny_recipe_settings()


def copy_multi30k(directory, splits):
    """A Multi30k directory of the first lines of each split."""
    os.makedirs(directory)
    for split, lines in splits.items():
        for language in ("en", "de"):
            with open(MULTI30K / f"{split}.{language}") as f:
                head = [next(f) for _ in range(lines)]
            with open(os.path.join(directory, f"{split}.{language}"), "w") as f:
                f.writelines(head)
    return directory


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"{MISSING_DATA_REASON} {MULTI30K}")
    root = tmp_path_factory.mktemp("data")
    return pathlib.Path(
        copy_multi30k(
            os.path.join(root, "multi30k"),
            {"train": 2000, "valid": 20, "test": 12},
        )
    )


@pytest.fixture(scope="module")
def no_test_dir(data_dir, tmp_path_factory):
    """The same data without the test split."""
    directory = tmp_path_factory.mktemp("data") / "no-test"
    shutil.copytree(data_dir, directory)
    for language in ("en", "de"):
        os.remove(directory / f"test.{language}")
    return directory


def train(data_dir, output, **settings):
    """A tiny run of the multi30k recipe: 2 steps, no evaluation."""
    return training.run_recipe(
        RECIPE,
        data_dir=data_dir,
        output=output,
        **{
            "max_steps": 2,
            "evaluate": False,
            "verbose": 0,
            **SMALL,
            **settings,
        },
    )


@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
    output = os.path.join(tmp_path_factory.mktemp("runs"), "run")
    summary = train(data_dir, output)
    assert summary.steps == 2
    return output


def snapshot(directory):
    """Every file under ``directory`` and the sha256 of its bytes."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            files[os.path.relpath(path, directory)] = digest
    return files


def read_json(path):
    with open(path) as f:
        return json.load(f)


def cli_train(data_dir, output, *arguments, max_steps="2"):
    return cli.main(
        [
            "train",
            "--recipe",
            RECIPE,
            "--data-dir",
            str(data_dir),
            "--output",
            str(output),
            "--max-steps",
            max_steps,
            "--no-evaluate",
            "--quiet",
            *arguments,
        ]
    )


# --- 1. an existing output directory is resumed or refused, never clobbered


def test_an_output_directory_is_resumed_only_by_the_same_run(
    finished_run, data_dir, tmp_path, capsys
):
    run = shutil.copytree(finished_run, tmp_path / "run")
    before = snapshot(run)
    assert read_json(run / RUN_FILE)["settings"]["vocabulary_size"] == 600
    # Other settings, another seed, other data: refused, nothing changed.
    with pytest.raises(
        ValueError,
        match=r"vocabulary_size is 600 in the run, 700 now.*overwrite=True",
    ):
        train(data_dir, run, vocabulary_size=700)
    with pytest.raises(ValueError, match=r"model\.hidden_dim is 32 in the"):
        train(data_dir, run, model={**TINY_RECIPE_MODEL, "hidden_dim": 64})
    with pytest.raises(ValueError, match="seed is 0 in the run, 1 now"):
        train(data_dir, run, seed=1)
    assert cli_train(data_dir, run, "--set", "max_tokens=256") == 1
    error = capsys.readouterr().err
    assert "max_tokens is 512 in the run, 256 now" in error
    assert error.count("\n") == 1
    assert snapshot(run) == before
    # The same run resumes: it had finished, so it trains no further and
    # keeps its tokenizer; settings that only change the report may vary.
    summary = train(data_dir, run, beam_size=2)
    assert summary.steps == 2
    after = snapshot(run)
    for name in ("tokenizer/tokenizer.model", "state/training_state.json"):
        assert after[name] == before[name]


def test_a_saved_translator_is_refused_or_overwritten(
    finished_run, data_dir, tmp_path
):
    translator_dir = tmp_path / "translator"
    Translator.from_pretrained(finished_run).save(translator_dir)
    before = snapshot(translator_dir)
    with pytest.raises(ValueError, match="holds a saved translator"):
        train(data_dir, translator_dir, vocabulary_size=700)
    assert snapshot(translator_dir) == before
    # overwrite=True replaces it with the new run, tokenizer included.
    summary = train(
        data_dir, translator_dir, vocabulary_size=700, overwrite=True
    )
    assert summary.steps == 2
    translator = Translator.from_pretrained(translator_dir)
    assert translator.tokenizer.vocabulary_size == 700
    assert translator.model.vocabulary_size == 700
    assert read_json(translator_dir / RUN_FILE)["settings"][
        "vocabulary_size"
    ] == (700)


def test_train_command_refuses_then_overwrites_with_the_flag(
    finished_run, data_dir, tmp_path, capsys
):
    run = shutil.copytree(finished_run, tmp_path / "run")
    before = snapshot(run)
    settings = set_arguments({**SMALL, "vocabulary_size": 700})
    assert cli_train(data_dir, run, *settings) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "--overwrite" in error
    assert "vocabulary_size" in error
    assert snapshot(run) == before
    assert cli_train(data_dir, run, *settings, "--overwrite") == 0
    assert read_json(run / RUN_FILE)["settings"]["vocabulary_size"] == 700


def test_overwrite_never_replaces_a_directory_with_other_files(
    finished_run, data_dir, tmp_path
):
    run = shutil.copytree(finished_run, tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"not a keras_transformer run \("):
        train(data_dir, run, vocabulary_size=700, overwrite=True)
    assert snapshot(run) == before
    # Nor writes a new run into a directory of other files.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        train(data_dir, other)
    assert sorted(os.listdir(other)) == ["notes.txt"]
    # A README.md alone (a name translators share with other projects)
    # does not make a directory a run.
    (other / "notes.txt").rename(other / "README.md")
    with pytest.raises(ValueError, match=r"not a keras_transformer run \(R"):
        train(data_dir, other, overwrite=True)
    assert (other / "README.md").read_text() == "mine"


# --- 2. a run that fails leaves the output as it found it


def test_a_run_that_fails_to_start_writes_nothing(data_dir, tmp_path):
    broken = shutil.copytree(data_dir, tmp_path / "empty-train")
    (broken / "train.en").write_text("")
    output = tmp_path / "run"
    with pytest.raises(ValueError, match=r"train\.en' is empty"):
        train(broken, output)
    assert not output.exists()
    # A failure after the tokenizer is trained (the two sides do not
    # align) leaves an existing empty directory empty: no tokenizer/ for
    # the next run to take.
    (broken / "train.en").write_text(
        "".join((data_dir / "train.en").open().readlines()[:-1])
    )
    output.mkdir()
    with pytest.raises(ValueError, match="has 1999 lines"):
        train(broken, output)
    assert os.listdir(output) == []


def test_a_file_is_complete_or_absent(tmp_path):
    directory = check_output(tmp_path / "run", {"seed": 0})
    directory.start()

    def save_half(path):
        os.makedirs(path)
        with open(os.path.join(path, "tokenizer.model"), "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        directory.save_whole("tokenizer", save_half)
    assert not (tmp_path / "run" / "tokenizer").exists()
    # The same run resumes and writes it whole.
    again = check_output(tmp_path / "run", {"seed": 0})
    assert again.resume
    again.save_whole("tokenizer", lambda path: os.makedirs(path))
    assert sorted(os.listdir(tmp_path / "run")) == [RUN_FILE, "tokenizer"]


def test_a_run_recorded_before_a_setting_existed_resumes_at_its_default(
    tmp_path,
):
    old = {"seed": 0, "settings": {"max_tokens": 512}}
    check_output(tmp_path / "run", old).start()
    defaults = {"batch_multiple": 1, "beam_size": 4}

    def fingerprint(multiple):
        return {
            "seed": 0,
            "settings": {"max_tokens": 512, "batch_multiple": multiple},
        }

    again = check_output(tmp_path / "run", fingerprint(1), False, defaults)
    assert again.resume
    with pytest.raises(
        ValueError, match="batch_multiple is 1 in the run, 2 now"
    ):
        check_output(tmp_path / "run", fingerprint(2), False, defaults)


# --- 3. every setting, split and path is checked before any work


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"steps_per_epoch": 0}, r"steps_per_epoch=0 \(an int\) must be an"),
        ({"max_tokens": "abc"}, r"max_tokens='abc' \(a str\) must be an"),
        ({"max_steps": 0}, r"max_steps=0 \(an int\)"),
        ({"max_steps": -3}, r"max_steps=-3 \(an int\)"),
        ({"warmup_steps": 2.5}, r"warmup_steps=2\.5 \(a float\)"),
        ({"label_smoothing": 1.0}, r"label_smoothing=1.0 .* \[0, 1\)"),
        ({"learning_rate_scale": float("nan")}, "learning_rate_scale=nan"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0"),
        ({"dtype": "float33"}, "dtype='float33'"),
        (
            {"model": {**TINY_RECIPE_MODEL, "num_heads": 3}},
            "model: num_heads=3 must",
        ),
        ({"vocabulary_size": True}, r"vocabulary_size=True \(a bool\)"),
    ],
)
def test_bad_settings_are_named_before_any_work(
    data_dir, tmp_path, settings, message
):
    output = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        train(data_dir, output, **settings)
    assert not output.exists()


def test_missing_splits_and_unwritable_outputs_fail_before_any_work(
    no_test_dir, data_dir, tmp_path, capsys
):
    output = tmp_path / "run"
    with pytest.raises(
        FileNotFoundError,
        match=r"test split 'test2016' is missing.*--no-evaluate",
    ):
        train(no_test_dir, output, evaluate=True)
    assert not output.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(FileExistsError, match="is a file"):
        train(data_dir, a_file)
    with pytest.raises(FileExistsError, match="a-file' is a file"):
        train(data_dir, a_file / "run")
    with pytest.raises(ValueError, match="cannot be written"):
        train(data_dir, "/proc/keras-transformer-run")
    # The command prints each as one line.
    for arguments, message in (
        (["--set", "steps_per_epoch=0"], "steps_per_epoch=0"),
        (["--set", "max_tokens=abc"], "max_tokens='abc'"),
    ):
        assert cli_train(data_dir, output, *arguments) == 1
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1
    assert cli_train(data_dir, a_file, "--set", "bleu_subset=0") == 1
    assert "is a file" in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_the_command_refuses_max_steps_below_one_in_one_line(
    data_dir, tmp_path, capsys, steps
):
    output = tmp_path / "run"
    status = cli_train(data_dir, output, max_steps=steps)
    captured = capsys.readouterr()
    assert status == 1
    assert captured.err.splitlines() == [
        f"keras-transformer train: error: Recipe setting max_steps={steps} "
        "(an int) must be an integer of at least 1."
    ]
    assert captured.out == ""
    assert not output.exists()


def test_a_directory_in_place_of_a_training_file_is_one_line(
    data_dir, tmp_path, capsys
):
    broken = shutil.copytree(data_dir, tmp_path / "data")
    os.remove(broken / "train.en")
    (broken / "train.en").mkdir()
    output = tmp_path / "run"
    with pytest.raises(ValueError) as caught:
        train(broken, output)
    assert str(caught.value) == (
        f"{str(broken / 'train.en')!r} is a directory, not a text file. Put "
        "the split's sentences there as a file, one per line."
    )
    assert not output.exists()
    # The command says the same in one line, and writes nothing either.
    assert cli_train(broken, output) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"keras-transformer train: error: {caught.value}"
    ]
    assert not output.exists()


# --- 4. a run shorter than the recipe's schedule still learns


def test_a_short_run_warms_up_and_cools_down(data_dir, tmp_path):
    output = tmp_path / "run"
    train(data_dir, output, max_steps=20, steps_per_epoch=4, checkpoint_every=4)
    recipe = training.get_recipe(RECIPE)
    assert recipe.warmup_steps + recipe.cooldown_steps > 20
    settings = read_json(output / "results.json")["recipe_settings"]
    assert (settings["warmup_steps"], settings["cooldown_steps"]) == (8, 12)
    schedule = training.TransformerSchedule(
        TINY_RECIPE_MODEL["hidden_dim"],
        settings["warmup_steps"],
        settings["learning_rate_scale"],
        20,
        settings["cooldown_steps"],
    )
    rates = keras.ops.convert_to_numpy(schedule(keras.ops.arange(20)))
    assert (rates > 0).all()
    assert int(np.argmax(rates)) == 7  # the last warm-up step
    assert (np.diff(rates[:8]) > 0).all() and (np.diff(rates[7:]) < 0).all()
    # The rates the run logged at the end of each epoch: up, then down.
    with open(output / "logs" / "training.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [float(row["learning_rate"]) for row in rows]
    assert len(logged) == 5
    assert all(rate > 0 for rate in logged[:-1])
    assert logged[0] < logged[1] > logged[2] > logged[3] > logged[4]
    np.testing.assert_allclose(logged[:4], rates[[4, 8, 12, 16]], rtol=1e-5)
    # And it learns.
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])


def test_max_steps_of_zero_or_below_is_refused(data_dir, tmp_path):
    for steps in (0, -1):
        with pytest.raises(ValueError, match=f"max_steps={steps} "):
            train(data_dir, tmp_path / "run", max_steps=steps)
    assert not (tmp_path / "run").exists()
    assert training.fit_schedule(400, 575, 20) == (8, 12)
    assert training.fit_schedule(400, 575, 1725) == (400, 575)
    assert training.fit_schedule(4000, 0, 1) == (1, 0)


# --- 5. Ctrl-C says where the same command resumes


class CtrlC(keras.callbacks.Callback):
    """Sends this process SIGINT (what Ctrl-C does) after step ``at``.

    With ``donated=True`` it first deletes, on JAX, the arrays of the
    model's state, as a Ctrl-C inside a compiled step leaves them: the
    step was given them to overwrite (Keras donates its input buffers)."""

    def __init__(self, at, donated=False):
        super().__init__()
        self.at = at
        self.donated = donated

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if step != self.at:
            return
        if self.donated:
            self.model.jax_state_sync()
            model = self.model
            for variable in [*model.variables, *model.optimizer.variables]:
                variable.value.delete()
        signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("donated", [False, True], ids=["", "donated"])
def test_ctrl_c_says_which_epoch_a_rerun_resumes_from(
    no_test_dir, tmp_path, donated
):
    if donated and keras.backend.backend() != "jax":
        pytest.skip("JAX donates the state's buffers to a compiled step")
    # A data directory without the test split trains when not evaluated.
    output = tmp_path / "run"
    with pytest.raises(training.RunInterrupted) as caught:
        train(
            no_test_dir,
            output,
            max_steps=6,
            callbacks=[CtrlC(at=3, donated=donated)],
        )
    error = caught.value
    assert isinstance(error, KeyboardInterrupt)
    assert (error.step, error.resume_epoch, error.epochs) == (3, 2, 3)
    assert "\n" not in str(error)
    assert "resume from epoch 2 of 3" in str(error)
    state = read_json(output / "state" / "training_state.json")
    assert (state["epoch"], state["step"]) == (1, 2)
    # The same call resumes from there and finishes.
    summary = train(no_test_dir, output, max_steps=6)
    assert summary.steps == 6
    with open(output / "logs" / "training.csv") as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert epochs == [0, 1, 2]
