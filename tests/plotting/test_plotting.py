"""`plot_attention`, `plot_training` and their commands: the PNG files
open, have the size asked for, and carry the tokens and values drawn."""

import csv
import os

import keras
import numpy as np
import pytest
from matplotlib import image

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.plotting import (
    LOG_FILE,
    attention_figure_size,
    plot_attention,
    plot_training,
)
from keras_transformer.training import TransformerSchedule
from keras_transformer.training.callbacks import LearningRateLogger
from tests.generation.conftest import SENTENCES


@pytest.fixture(scope="module")
def attention(translator):
    return translator.attention(SENTENCES[0], SENTENCES[4])


def pixels(width, height, dpi):
    return round(height * dpi), round(width * dpi)


def labels(ticks):
    return [t.get_text() for t in ticks]


def test_attention_png_size_and_token_labels(attention, tmp_path):
    path = tmp_path / "sub" / "cross.png"
    figure = kt.plot_attention(attention, path, dpi=50)
    layers, heads = attention.cross_attention.shape[:2]
    panels = figure.axes
    assert len(panels) == layers * heads == 4
    for i, axes in enumerate(panels):
        assert labels(axes.get_xticklabels()) == attention.source_tokens
        assert labels(axes.get_yticklabels()) == attention.output_tokens
        assert axes.get_title() == f"layer {i // heads} head {i % heads}"
        # The heatmap is the weights themselves.
        drawn = axes.images[0].get_array()
        np.testing.assert_array_equal(
            drawn, attention.cross_attention[i // heads, i % heads]
        )
    png = image.imread(path)
    width, height = attention_figure_size(
        attention.output_tokens, attention.source_tokens, layers, heads
    )
    assert png.shape[:2] == pixels(width, height, 50)
    # A figure is not blank: the heatmaps draw many colours.
    assert len(np.unique(png.reshape(-1, png.shape[-1]), axis=0)) > 20


def test_attention_one_layer_and_self_attention(attention, tmp_path):
    path = tmp_path / "decoder.png"
    figure = plot_attention(
        attention, path, kind="decoder_self_attention", layer=-1, heads=1
    )
    (axes,) = figure.axes
    assert axes.get_title() == "layer 1 head 1"
    assert labels(axes.get_xticklabels()) == attention.target_tokens
    assert labels(axes.get_yticklabels()) == attention.target_tokens
    width, height = attention_figure_size(
        attention.target_tokens, attention.target_tokens, 1, 1
    )
    assert image.imread(path).shape[:2] == pixels(width, height, 100)

    figure = plot_attention(attention, kind="encoder_self_attention")
    assert labels(figure.axes[0].get_yticklabels()) == attention.source_tokens


def test_attention_from_an_array_and_bad_arguments():
    weights = np.full((3, 5), 0.2, "float32")
    figure = plot_attention(weights, query_tokens=list("abc"))
    assert labels(figure.axes[0].get_yticklabels()) == ["a", "b", "c"]
    assert labels(figure.axes[0].get_xticklabels()) == list("01234")
    with pytest.raises(ValueError, match="query_tokens has 2 tokens"):
        plot_attention(weights, query_tokens=["a", "b"])
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        plot_attention(weights, layer=2)
    with pytest.raises(ValueError, match="kind='cross'"):
        plot_attention(weights, kind="cross")
    with pytest.raises(ValueError, match=r"got shape \(5,\)"):
        plot_attention(np.ones(5))


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    """A real run's log: a tiny model fit with the paper's schedule,
    `LearningRateLogger` and `CSVLogger`, as the recipes do."""
    run = tmp_path_factory.mktemp("run")
    os.makedirs(run / "logs")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    schedule = TransformerSchedule(64, warmup_steps=4)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    x = np.random.default_rng(0).normal(size=(24, 4)).astype("float32")

    class FakeBleu(keras.callbacks.Callback):
        # What `BleuCallback` adds, without translating.
        def on_epoch_end(self, epoch, logs=None):
            logs["val_bleu"] = 10.0 * epoch

    model.fit(
        x,
        x[:, :1],
        batch_size=8,
        epochs=4,
        verbose=0,
        callbacks=[
            FakeBleu(),
            LearningRateLogger(),
            keras.callbacks.CSVLogger(str(run / "logs" / LOG_FILE)),
        ],
    )
    return run, schedule


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_learning_rate_is_logged(training_run):
    run, schedule = training_run
    rows = read_csv(run / "logs" / LOG_FILE)
    assert len(rows) == 4
    # 3 steps an epoch: the schedule's value at steps 3, 6, 9, 12.
    for epoch, row in enumerate(rows):
        expected = float(schedule(3 * (epoch + 1)))
        assert float(row["learning_rate"]) == pytest.approx(expected)


def test_training_png_draws_the_log(training_run, tmp_path):
    run, _ = training_run
    rows = read_csv(run / "logs" / LOG_FILE)
    path = tmp_path / "training.png"
    figure = plot_training(run, path, dpi=40, panel_size=(3.0, 2.5))
    titles = [axes.get_title() for axes in figure.axes]
    assert titles == ["loss", "learning rate", "BLEU"]
    for axes, column in zip(
        figure.axes, ["loss", "learning_rate", "val_bleu"], strict=True
    ):
        (line,) = axes.get_lines()
        np.testing.assert_allclose(line.get_xdata(), [1, 2, 3, 4])
        np.testing.assert_allclose(
            line.get_ydata(), [float(r[column]) for r in rows], rtol=1e-6
        )
    assert image.imread(path).shape[:2] == pixels(9.0, 2.5, 40)


def test_training_log_without_validation(tmp_path):
    # CSVLogger's columns when fit has no validation: val_ columns of NA.
    log = tmp_path / "training.csv"
    log.write_text(
        "epoch,learning_rate,loss,val_learning_rate,val_loss\n"
        "0,0.001,5.5,NA,NA\n"
        "1,0.002,3.25,NA,NA\n"
    )
    figure = plot_training(log)
    assert [axes.get_title() for axes in figure.axes] == [
        "loss",
        "learning rate",
    ]
    (line,) = figure.axes[0].get_lines()
    np.testing.assert_allclose(line.get_ydata(), [5.5, 3.25])
    log.write_text("epoch,val_loss\n0,NA\n")
    with pytest.raises(ValueError, match=r"it has \['epoch', 'val_loss'\]"):
        plot_training(log)


def test_plot_training_command(training_run, tmp_path, capsys):
    run, _ = training_run
    assert cli.main(["plot-training", str(run), "--dpi", "30"]) == 0
    path = run / "logs" / "training.png"
    assert capsys.readouterr().out.strip() == str(path)
    assert image.imread(path).shape[:2] == pixels(12.0, 3.0, 30)

    assert cli.main(["plot-training", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert "No training log at" in error and str(tmp_path) in error


def test_translate_command_plots_attention(translator, tmp_path, capsys):
    translator.save(tmp_path / "model")
    source = tmp_path / "source.txt"
    source.write_text(f"{SENTENCES[4]}\n\n{SENTENCES[0]}\n")
    out = tmp_path / "attention.png"
    args = ["translate", "--model", str(tmp_path / "model")]
    args += ["--input", str(source), "--method", "greedy", "--quiet"]
    args += ["--plot-attention", str(out), "--attention-layer", "0"]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    translations = captured.out.splitlines()
    assert len(translations) == 3 and translations[1] == ""
    assert translations[0] and translations[2]
    # One file per non-empty line, named by line number.
    assert not out.exists()
    assert not (tmp_path / "attention-2.png").exists()
    for line in (1, 3):
        png = image.imread(tmp_path / f"attention-{line}.png")
        assert min(png.shape[:2]) > 100
        assert f"attention-{line}.png" in captured.err
