"""Pictures of a model at work: attention heatmaps and training curves.

Figures are drawn with matplotlib's object-oriented API on the Agg
canvas, without `matplotlib.pyplot`: nothing needs a display, and the
matplotlib backend of the calling program (a notebook's, say) is left as
it is. Each function returns its `matplotlib.figure.Figure` and, given a
path, writes a PNG.

Example:
>>> attention = translator.attention("A man rides a bike.")
>>> kt.plot_attention(attention, "attention.png", layer=-1)
>>> kt.plot_training("runs/multi30k_en_de", "training.png")
"""

import csv
import math
import os

import numpy as np

KINDS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")

# Layout of the attention grid, in inches: the font is 8 points, about
# 0.07 inches per character of a tick label.
CELL_INCHES = 0.3
CHAR_INCHES = 0.07
MARGIN_INCHES = 0.4
TITLE_INCHES = 0.3

# Names under which the training log may hold each curve, in order of
# preference (keras' CSVLogger writes the keys of the epoch logs).
LOSS_COLUMNS = ("loss", "val_loss")
LEARNING_RATE_COLUMNS = ("learning_rate", "lr")
BLEU_COLUMNS = ("val_bleu", "bleu")
LOG_FILE = "training.csv"


def _figure(width, height, dpi):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path):
    if path is None:
        return
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, dpi=figure.dpi, format="png")


def _attention_and_tokens(attention, kind, query_tokens, key_tokens):
    """The ``(layers, heads, query, key)`` weights and both axes' labels."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}.")
    if hasattr(attention, kind):
        # A `SentenceAttention` from `Translator.attention`.
        weights = getattr(attention, kind)
        queries, keys = {
            "encoder_self_attention": ("source_tokens", "source_tokens"),
            "decoder_self_attention": ("target_tokens", "target_tokens"),
            "cross_attention": ("output_tokens", "source_tokens"),
        }[kind]
        query_tokens = query_tokens or getattr(attention, queries)
        key_tokens = key_tokens or getattr(attention, keys)
    else:
        weights = attention
    weights = np.asarray(weights, dtype="float32")
    if weights.ndim not in (2, 3, 4):
        raise ValueError(
            "plot_attention expects weights of shape (query, key), (heads, "
            f"query, key) or (layers, heads, query, key); got shape "
            f"{weights.shape}. Pass one sentence's weights."
        )
    weights = weights.reshape((1,) * (4 - weights.ndim) + weights.shape)
    num_queries, num_keys = weights.shape[2:]
    if query_tokens is None:
        query_tokens = [str(i) for i in range(num_queries)]
    if key_tokens is None:
        key_tokens = [str(i) for i in range(num_keys)]
    for name, tokens, length in (
        ("query_tokens", query_tokens, num_queries),
        ("key_tokens", key_tokens, num_keys),
    ):
        if len(tokens) != length:
            raise ValueError(
                f"{name} has {len(tokens)} tokens but the weights have "
                f"{length} positions on that axis (shape {weights.shape}). "
                "Pass one label per position."
            )
    return weights, [str(t) for t in query_tokens], [str(t) for t in key_tokens]


def _select(chosen, name, count):
    if chosen is None:
        return list(range(count))
    chosen = [chosen] if isinstance(chosen, (int, np.integer)) else chosen
    selected = []
    for index in chosen:
        if not -count <= int(index) < count:
            raise ValueError(
                f"{name}={index} is out of range: the weights have {count} "
                f"{name}s (0 to {count - 1}, or negative from the end)."
            )
        selected.append(int(index) % count)
    return selected


def attention_figure_size(query_tokens, key_tokens, rows, columns):
    """The size in inches of `plot_attention`'s figure: ``rows`` by
    ``columns`` panels, each ``CELL_INCHES`` per token plus room for the
    tick labels (``CHAR_INCHES`` per character of the longest one) and a
    title."""
    longest_query = max((len(t) for t in query_tokens), default=1)
    longest_key = max((len(t) for t in key_tokens), default=1)
    width = (
        CELL_INCHES * len(key_tokens)
        + CHAR_INCHES * longest_query
        + MARGIN_INCHES
    )
    height = (
        CELL_INCHES * len(query_tokens)
        + CHAR_INCHES * longest_key
        + MARGIN_INCHES
        + TITLE_INCHES
    )
    return columns * width, rows * height + TITLE_INCHES


def plot_attention(
    attention,
    path=None,
    *,
    kind="cross_attention",
    layer=None,
    heads=None,
    query_tokens=None,
    key_tokens=None,
    dpi=100,
    cmap="viridis",
    title=None,
):
    """Heatmaps of attention weights, one panel per layer and head.

    Rows are queries and columns keys, labelled with their tokens; the
    colour scale runs from 0 to 1 in every panel. Cross-attention rows
    are labelled with the token each decoder position predicts (so that
    an aligned pair such as "Mann" and "man" meet on the heatmap), the
    decoder self-attention axes with the decoder's input tokens.

    Args:
        attention: a `SentenceAttention` from `Translator.attention`, or
            the weights of one sentence as an array of shape
            ``(layers, heads, query, key)``, ``(heads, query, key)`` or
            ``(query, key)``.
        path: where to write the PNG; None to only return the figure.
        kind: ``"cross_attention"``, ``"encoder_self_attention"`` or
            ``"decoder_self_attention"`` (for a `SentenceAttention`).
        layer: one layer index (negative counts from the end) or a list
            of them; None for all: a grid of layers by heads.
        heads: one head index or a list; None for all.
        query_tokens, key_tokens: axis labels; taken from a
            `SentenceAttention`, position numbers for a bare array.
        dpi: pixels per inch of the PNG; its size in inches is
            `attention_figure_size`.
        cmap: a matplotlib colormap name.
        title: the figure's title (default: ``kind``).

    Returns:
        The `matplotlib.figure.Figure`, one axes per panel in row-major
        order.
    """
    weights, query_tokens, key_tokens = _attention_and_tokens(
        attention, kind, query_tokens, key_tokens
    )
    layers = _select(layer, "layer", weights.shape[0])
    head_indices = _select(heads, "head", weights.shape[1])
    width, height = attention_figure_size(
        query_tokens, key_tokens, len(layers), len(head_indices)
    )
    figure = _figure(width, height, dpi)
    figure.suptitle(title or kind.replace("_", " "), fontsize=10)
    grid = figure.subplots(len(layers), len(head_indices), squeeze=False)
    for row, layer_index in enumerate(layers):
        for column, head in enumerate(head_indices):
            axes = grid[row][column]
            axes.imshow(
                weights[layer_index, head],
                cmap=cmap,
                vmin=0.0,
                vmax=1.0,
                aspect="auto",
                interpolation="nearest",
            )
            axes.set_title(f"layer {layer_index} head {head}", fontsize=9)
            axes.set_xticks(range(len(key_tokens)))
            axes.set_xticklabels(key_tokens, rotation=90, fontsize=8)
            axes.set_yticks(range(len(query_tokens)))
            axes.set_yticklabels(query_tokens, fontsize=8)
            axes.tick_params(length=0)
    _save(figure, path)
    return figure


def find_training_log(log):
    """The path of a run's CSV training log: ``log`` itself if it is a
    file, else ``training.csv`` in it or in its ``logs/``."""
    log = os.fspath(log)
    if os.path.isfile(log):
        return log
    candidates = [
        os.path.join(log, LOG_FILE),
        os.path.join(log, "logs", LOG_FILE),
    ]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"No training log at {log!r}: expected a CSV file or a run "
        f"directory holding one of {candidates} (written by "
        "`keras-transformer train`)."
    )


def read_training_log(log):
    """Reads a CSV training log into ``{column: float array}``.

    Missing values (``NA``, empty) become NaN; so do rows of an
    interrupted write.

    Args:
        log: a CSV file, a run directory or its ``logs/`` directory.
    """
    path = find_training_log(log)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or not rows[0]:
        raise ValueError(f"The training log {path!r} is empty.")
    header, rows = rows[0], rows[1:]

    def number(text):
        try:
            return float(text)
        except ValueError:
            return math.nan

    columns = {name: [] for name in header}
    for row in rows:
        row = row + [""] * (len(header) - len(row))
        for name, value in zip(header, row, strict=False):
            columns[name].append(number(value))
    return {name: np.asarray(values) for name, values in columns.items()}


def plot_training(log, path=None, *, dpi=100, panel_size=(4.0, 3.0)):
    """Training curves of a run: loss, learning rate and BLEU by epoch.

    Draws one panel for each of these with values in the CSV log that
    `keras-transformer train` writes (``logs/training.csv``): ``loss``
    (with ``val_loss`` when logged), ``learning_rate`` (or ``lr``) and
    ``val_bleu`` (or ``bleu``).

    Args:
        log: the run directory, its ``logs/`` directory or the CSV file.
        path: where to write the PNG; None to only return the figure.
        dpi: pixels per inch.
        panel_size: (width, height) of each panel in inches.

    Returns:
        The `matplotlib.figure.Figure`.
    """
    columns = read_training_log(log)
    # CSVLogger adds a column of "NA" for each val_ key of a run without
    # validation: those draw nothing.
    drawn = {n for n, v in columns.items() if np.isfinite(v).any()}
    panels = []
    loss = [name for name in LOSS_COLUMNS if name in drawn]
    if loss:
        panels.append(("loss", loss))
    for label, names in (
        ("learning rate", LEARNING_RATE_COLUMNS),
        ("BLEU", BLEU_COLUMNS),
    ):
        found = [name for name in names if name in drawn]
        if found:
            panels.append((label, found[:1]))
    if not panels:
        raise ValueError(
            f"The training log {find_training_log(log)!r} has none of the "
            f"columns {list(LOSS_COLUMNS + LEARNING_RATE_COLUMNS)} or "
            f"{list(BLEU_COLUMNS)} with a value; it has {sorted(columns)}."
        )
    length = len(next(iter(columns.values())))
    epochs = columns.get("epoch", np.arange(length)) + 1
    width, height = panel_size
    figure = _figure(width * len(panels), height, dpi)
    grid = figure.subplots(1, len(panels), squeeze=False)[0]
    for axes, (label, names) in zip(grid, panels, strict=True):
        for name in names:
            axes.plot(epochs, columns[name], marker=".", label=name)
        axes.set_title(label, fontsize=10)
        axes.set_xlabel("epoch", fontsize=9)
        axes.grid(alpha=0.3)
        if label == "learning rate":
            axes.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        if len(names) > 1:
            axes.legend(fontsize=8)
    _save(figure, path)
    return figure
