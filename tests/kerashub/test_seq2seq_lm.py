"""The KerasHub task on raw Multi30k text: presets, fit, generate."""

import collections
import json

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import keras_transformer as kt
from keras_transformer.data.text_pairs import token_budget_dataset
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


def _text(pairs, count=300, split="train"):
    sources, targets = pairs[split]
    return {"encoder_text": sources[:count], "decoder_text": targets[:count]}


def _rows(x, labels, weights):
    """The real tokens of each non-empty row: encoder ids, decoder ids,
    labels."""
    x = {key: np.asarray(value) for key, value in x.items()}
    labels, weights = np.asarray(labels), np.asarray(weights).astype(bool)
    return [
        (
            tuple(x["encoder_token_ids"][i][x["encoder_padding_mask"][i]]),
            tuple(x["decoder_token_ids"][i][x["decoder_padding_mask"][i]]),
            tuple(labels[i][weights[i]]),
        )
        for i in range(len(labels))
        if x["encoder_padding_mask"][i].any()
    ]


def test_token_budget_batches_hold_every_pair_once(pairs, subword_tokenizer):
    task = _task(subword_tokenizer)
    text = _text(pairs)
    # What the preprocessor gives the pairs when it batches them by count.
    expected = collections.Counter(_rows(*task.preprocessor(text)))
    dataset = token_budget_dataset(
        text, task.preprocessor, max_tokens=512, seed=0
    )
    epochs = []
    for _ in range(2):
        rows, batches = [], 0
        for x, labels, weights in dataset.as_numpy_iterator():
            batches += 1
            for side in ("encoder", "decoder"):
                # Padded positions, so real tokens too, within the budget.
                assert x[f"{side}_padding_mask"].size <= 512
            rows += _rows(x, labels, weights)
        # 300 pairs of up to 48 tokens a side: 24 batches of 10 to 18.
        assert batches == dataset.planner.num_batches == 24
        assert collections.Counter(rows) == expected
        epochs.append(rows)
    assert epochs[0] != epochs[1], "the second epoch is reshuffled"


class LabelTokens(keras.metrics.Metric):
    """Real label tokens (the sum of the sample weights) over an epoch,
    or the most in one batch."""

    def __init__(self, reduce="sum", **kwargs):
        super().__init__(name=f"label_tokens_{reduce}", **kwargs)
        self.reduce = reduce
        self.value = self.add_variable((), "zeros", name="value")

    def update_state(self, y_true, y_pred, sample_weight=None):
        tokens = ops.sum(ops.cast(sample_weight, "float32"))
        if self.reduce == "sum":
            self.value.assign_add(tokens)
        else:
            self.value.assign(ops.maximum(self.value, tokens))

    def result(self):
        # A new tensor, not a read of the variable: on TensorFlow a read
        # shares the variable's buffer, which validation then updates.
        return ops.add(self.value, 0.0)

    def reset_state(self):
        self.value.assign(0.0)


def _label_tokens(preprocessor, text):
    return float(np.asarray(preprocessor(text)[2]).sum())


def test_fit_batches_raw_text_by_a_token_budget(pairs, subword_tokenizer):
    task = _task(subword_tokenizer)
    task.compile(weighted_metrics=[LabelTokens("sum"), LabelTokens("max")])
    text, valid = _text(pairs, 100), _text(pairs, 40, "valid")
    # One shape (few programs to compile): 85 pairs and a short batch
    # padded with empty rows.
    planner = token_budget_dataset(text, task.preprocessor, 4096).planner
    assert planner.num_batches == 2
    dataset = tf.data.Dataset.from_tensor_slices(text)
    steps = keras.callbacks.LambdaCallback()
    steps.on_train_batch_end = lambda batch, logs: steps.count.append(batch)
    for x, extra in (
        (text, {"validation_data": valid}),
        (dataset, {}),
        (dataset.batch(7), {}),
    ):
        steps.count = []
        history = task.fit(
            x, max_tokens=4096, epochs=1, verbose=0, callbacks=[steps], **extra
        ).history
        # Every pair once: all label tokens of the 100 pairs, in 2 batches
        # of at most 4096 tokens.
        assert history["label_tokens_sum"] == [
            _label_tokens(task.preprocessor, text)
        ]
        assert history["label_tokens_max"][0] <= 4096
        assert len(steps.count) == 2
        if extra:
            assert history["val_label_tokens_sum"] == [
                _label_tokens(task.preprocessor, valid)
            ]
            assert np.isfinite(history["val_loss"][0])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(batch_size=32, max_tokens=1024), "batch_size=32 and max_tokens"),
        (dict(max_tokens=0), "max_tokens=0 must be a positive int"),
        (dict(max_tokens=3), "max_tokens=3 cannot hold the longest pair"),
        (dict(max_tokens=64, y=[1]), "give no y or sample_weight"),
        (
            dict(max_tokens=64, x=np.zeros((2, 3))),
            "x is ndarray; max_tokens batches raw text",
        ),
        (
            dict(
                max_tokens=64,
                x=tf.data.Dataset.from_tensors(
                    {"encoder_text": "a", "decoder_text": "b"}
                ).repeat(),
            ),
            "x is an endless",
        ),
        (
            dict(max_tokens=64, validation_data={"encoder_text": ["a"]}),
            "validation_data has no 'decoder_text' key",
        ),
    ],
)
def test_bad_token_budgets_are_refused_in_one_line(
    subword_tokenizer, arguments, message
):
    task = _task(subword_tokenizer)
    x = {"encoder_text": ["A man.", "Two dogs."]}
    x["decoder_text"] = ["Ein Mann.", "Zwei Hunde."]
    arguments = {"x": x, **arguments}
    with pytest.raises(ValueError, match=message) as error:
        task.fit(epochs=1, verbose=0, **arguments)
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def bart_preset(tmp_path_factory):
    """A tiny KerasHub BART task saved as a preset (another
    architecture's), built here: no download."""
    vocabulary = ["<s>", "<pad>", "</s>", "<mask>", "a", "b", "Ġ", "Ġa", "Ġb"]
    tokenizer = keras_hub.models.BartTokenizer(
        vocabulary={token: i for i, token in enumerate(vocabulary)},
        merges=["Ġ a", "Ġ b"],
    )
    preprocessor = keras_hub.models.BartSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=8, decoder_sequence_length=8
    )
    backbone = keras_hub.models.BartBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=16,
    )
    path = tmp_path_factory.mktemp("bart_preset")
    keras_hub.models.BartSeq2SeqLM(backbone, preprocessor).save_to_preset(
        str(path)
    )
    return str(path)


@pytest.mark.parametrize(
    "cls, loader",
    [
        (TransformerSeq2SeqLM, "Seq2SeqLM"),
        (TransformerBackbone, "Backbone"),
        (TransformerSeq2SeqLMPreprocessor, "Seq2SeqLMPreprocessor"),
    ],
)
def test_from_preset_names_the_architecture_it_holds(bart_preset, cls, loader):
    expected = (
        f"{bart_preset} holds a BartBackbone preset; {cls.__name__} loads "
        "TransformerBackbone presets (saved by keras_transformer). Load it "
        f"with keras_hub.models.{loader}.from_preset instead."
    )
    with pytest.raises(ValueError) as error:
        cls.from_preset(bart_preset)
    assert str(error.value) == expected
    # The advice holds: KerasHub's base class loads the BART preset.
    loaded = getattr(keras_hub.models, loader).from_preset(bart_preset)
    assert type(loaded).__name__ == f"Bart{loader}"


def test_from_preset_names_the_architecture_of_a_hub_preset(
    bart_preset, tmp_path
):
    """``hf://owner/name`` and ``hf://owner/name@revision``: the preset's
    config.json is read from a local Hub server by a fresh process whose
    huggingface_hub points at it."""
    import os
    import subprocess
    import sys

    from huggingface_hub import HfApi

    from tests.conftest import REPO_ROOT
    from tests.hub.hub_server import HubServer

    server = HubServer(0, tokens={"hf_bart_token": "bart-owner"}).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        api = HfApi(endpoint=endpoint, token="hf_bart_token")
        api.create_repo("bart-owner/tiny-bart")
        api.upload_folder(
            folder_path=bart_preset, repo_id="bart-owner/tiny-bart"
        )
        revision = api.model_info("bart-owner/tiny-bart").sha
        presets = ["hf://bart-owner/tiny-bart"]
        presets.append(f"{presets[0]}@{revision}")
        code = (
            "import json, keras_transformer\n"
            "from keras_transformer.kerashub import TransformerSeq2SeqLM\n"
            "errors = []\n"
            f"for preset in {presets!r}:\n"
            "    try:\n"
            "        TransformerSeq2SeqLM.from_preset(preset)\n"
            "    except ValueError as error:\n"
            "        errors.append(str(error))\n"
            "print(json.dumps(errors))\n"
        )
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("HF_TOKEN", "HF_HUB_OFFLINE")
        }
        env.update(
            HF_ENDPOINT=endpoint,
            HF_HOME=str(tmp_path / "hf-home"),
            HF_HUB_DISABLE_XET="1",
            PYTHONPATH=str(REPO_ROOT),
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.splitlines()[-1])
    assert errors == [
        f"{preset} holds a BartBackbone preset; TransformerSeq2SeqLM loads "
        "TransformerBackbone presets (saved by keras_transformer). Load it "
        "with keras_hub.models.Seq2SeqLM.from_preset instead."
        for preset in presets
    ]


def test_from_preset_still_loads_this_packages_presets(
    subword_tokenizer, tmp_path
):
    task = _task(subword_tokenizer)
    task.save_to_preset(str(tmp_path))
    loaded = TransformerSeq2SeqLM.from_preset(str(tmp_path))
    assert type(loaded) is TransformerSeq2SeqLM
    backbone = TransformerBackbone.from_preset(str(tmp_path))
    for a, b in zip(
        task.backbone.get_weights(), backbone.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    # The sequence lengths are saved (KerasHub's base class saves none).
    preprocessor = TransformerSeq2SeqLMPreprocessor.from_preset(str(tmp_path))
    assert preprocessor.encoder_sequence_length == 48
    assert loaded.preprocessor.decoder_sequence_length == 48
