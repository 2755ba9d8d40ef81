"""Token ids and padding masks are checked where they enter the model:
out-of-range, negative and fractional ids and masks that are not 0 or 1
are refused with the first bad position, before any work (an id outside
the vocabulary reads no embedding row: NaN logits on JAX, a crash on
torch). Constructor arguments are named with their value and type."""

import inspect
import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import Transformer
from tests.helpers import random_batch, tiny_model

SOURCE_VOCABULARY = 53
TARGET_VOCABULARY = 41
SIZES = {
    "encoder_token_ids": SOURCE_VOCABULARY,
    "decoder_token_ids": TARGET_VOCABULARY,
}


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return tiny_model(
        vocabulary_size=SOURCE_VOCABULARY,
        target_vocabulary_size=TARGET_VOCABULARY,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )


def _batch(seed):
    rng = np.random.default_rng(seed)
    batch = random_batch(
        rng,
        batch=int(rng.integers(1, 5)),
        source_length=int(rng.integers(2, 12)),
        target_length=int(rng.integers(2, 9)),
        vocab=TARGET_VOCABULARY,
    )
    return rng, batch


def _plant(rng, array, values):
    """``array`` (as float64 when a value is fractional) with a random
    entry set to the first of ``values`` and, when there is room, a later
    entry (row-major) to the second: the first one must be reported."""
    if any(isinstance(v, float) and not v.is_integer() for v in values):
        array = array.astype("float64")
    array = array.copy()
    flat = int(rng.integers(0, array.size))
    index = np.unravel_index(flat, array.shape)
    array[index] = values[0]
    if flat + 1 < array.size:
        later = int(rng.integers(flat + 1, array.size))
        array[np.unravel_index(later, array.shape)] = values[1]
    return array, tuple(int(i) for i in index)


def _entries(model):
    """The ways concrete values reach the model."""
    return {
        "call": lambda x: model(x),
        "call_eager_tensors": lambda x: model(
            {k: ops.convert_to_tensor(v) for k, v in x.items()}
        ),
        "predict": lambda x: model.predict(x, verbose=0),
        "predict_on_batch": model.predict_on_batch,
        "attention_weights": model.attention_weights,
    }


def _bad_ids(kind, size):
    return {
        "too_large": (size, size + 7),
        "negative": (-1, -3),
        "fraction": (5.7, 2.5),
    }[kind]


@pytest.mark.parametrize("name", sorted(SIZES))
@pytest.mark.parametrize("kind", ["too_large", "negative", "fraction"])
@pytest.mark.parametrize(
    "entry",
    [
        "call",
        "call_eager_tensors",
        "predict",
        "predict_on_batch",
        "attention_weights",
    ],
)
def test_first_bad_id_is_found_exactly(model, name, kind, entry):
    size = SIZES[name]
    for seed in range(4):
        rng, batch = _batch(seed)
        values = _bad_ids(kind, size)
        batch[name], index = _plant(rng, batch[name], values)
        position = re.escape(f"{name}[{index[0]}, {index[1]}] = {values[0]}")
        what = (
            "is not a whole number"
            if kind == "fraction"
            else re.escape(f"is outside [0, {size})")
        )
        with pytest.raises(ValueError, match=f"^{position} {what}"):
            _entries(model)[entry](batch)


@pytest.mark.parametrize(
    "name", ["encoder_padding_mask", "decoder_padding_mask"]
)
@pytest.mark.parametrize("entry", ["call", "call_eager_tensors", "predict"])
def test_first_mask_entry_that_is_not_0_or_1_is_found_exactly(
    model, name, entry
):
    for seed in range(4):
        rng, batch = _batch(seed)
        value = [0.5, 2, -1][seed % 3]
        batch[name], index = _plant(rng, batch[name], (value, 3))
        position = re.escape(f"{name}[{index[0]}, {index[1]}] = {value} ")
        with pytest.raises(ValueError, match=f"^{position}is not 0 or 1"):
            _entries(model)[entry](batch)


def test_edge_ids_give_finite_logits(model):
    """The largest valid ids are accepted and give finite logits; one
    more is refused (on JAX it gave NaN logits without an error)."""
    _, batch = _batch(0)
    for name, size in SIZES.items():
        batch[name] = np.where(batch[name] > 0, size - 1, 0).astype("int32")
    logits = ops.convert_to_numpy(model(batch))
    assert logits.shape[-1] == TARGET_VOCABULARY
    assert np.isfinite(logits).all()
    # Integral floats and booleans are ids and masks too.
    as_floats = {k: v.astype("float32") for k, v in batch.items()}
    as_floats["encoder_padding_mask"] = batch["encoder_padding_mask"] > 0
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(as_floats)), logits, rtol=1e-6, atol=1e-6
    )
    batch["decoder_token_ids"][0, 0] = TARGET_VOCABULARY
    with pytest.raises(ValueError, match="target_vocabulary_size is 41"):
        model(batch)


def test_fit_refuses_bad_ids_and_labels_before_training(model):
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    _, batch = _batch(1)
    labels = batch["decoder_token_ids"].copy()
    before = [w.copy() for w in model.get_weights()]
    bad = dict(batch, encoder_token_ids=batch["encoder_token_ids"] - 1)
    with pytest.raises(ValueError, match=r"^encoder_token_ids\[\d+, \d+\]"):
        model.fit(bad, labels, verbose=0)
    bad_labels = labels.copy()
    bad_labels[-1, -1] = TARGET_VOCABULARY + 2
    row, column = bad_labels.shape[0] - 1, bad_labels.shape[1] - 1
    for call in (
        lambda: model.fit(batch, bad_labels, verbose=0),
        lambda: model.evaluate(batch, bad_labels, verbose=0),
        lambda: model.train_on_batch(batch, bad_labels),
        lambda: model.test_on_batch(batch, bad_labels),
        lambda: model.fit(
            batch, labels, validation_data=(batch, bad_labels), verbose=0
        ),
    ):
        with pytest.raises(
            ValueError, match=re.escape(f"labels[{row}, {column}] = 43 ")
        ):
            call()
    for x, y in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(x, y)
    # Valid data trains: the check lets it through.
    history = model.fit(batch, labels, verbose=0)
    assert np.isfinite(history.history["loss"][0])


CONSTRUCTOR_CASES = [
    ("hidden_dim", "64", "hidden_dim='64' (a str) must be a positive integer"),
    ("num_heads", 2.5, "num_heads=2.5 (a float) must be a positive integer"),
    ("vocabulary_size", None, "vocabulary_size=None must be a positive"),
    ("num_encoder_layers", 0, "num_encoder_layers=0 (an int) must be a"),
    ("num_decoder_layers", True, "num_decoder_layers=True (a bool) must"),
    ("intermediate_dim", -4, "intermediate_dim=-4 (an int) must be a"),
    ("max_sequence_length", "1k", "max_sequence_length='1k' (a str) must"),
    ("target_vocabulary_size", 0, "target_vocabulary_size=0 (an int) must"),
    ("dropout", "0.1", "dropout='0.1' (a str) must be a dropout rate"),
    ("attention_dropout", 1.0, "attention_dropout=1.0 (a float) must be a"),
    ("activation_dropout", float("nan"), "activation_dropout=nan (a float)"),
    ("normalize_first", "False", "normalize_first='False' (a str) must be"),
    ("share_embeddings", 1, "share_embeddings=1 (an int) must be True or"),
    ("tie_output_embeddings", None, "tie_output_embeddings=None must be"),
    ("scale_embeddings", "yes", "scale_embeddings='yes' (a str) must be"),
    ("use_output_bias", 0, "use_output_bias=0 (an int) must be True or"),
    ("layer_norm_epsilon", 0, "layer_norm_epsilon=0 (an int) must be a"),
    ("activation", "relux", "activation='relux' (a str) is not a Keras"),
    (
        "position_encoding_layout",
        "rotary",
        "position_encoding_layout='rotary' (a str) must be one of",
    ),
]


@pytest.mark.parametrize(
    "argument, value, message", CONSTRUCTOR_CASES, ids=lambda x: str(x)
)
def test_constructor_names_argument_value_and_type(argument, value, message):
    config = dict(
        vocabulary_size=20,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
    )
    config[argument] = value
    with pytest.raises(ValueError, match=f"^{re.escape(message)}") as error:
        Transformer(**config)
    assert "\n" not in str(error.value)


def test_every_constructor_argument_is_checked():
    checked = {case[0] for case in CONSTRUCTOR_CASES}
    parameters = inspect.signature(Transformer.__init__).parameters
    arguments = {
        name
        for name, p in parameters.items()
        if p.kind == p.POSITIONAL_OR_KEYWORD and name != "self"
    }
    assert arguments - checked == {"dtype"}
