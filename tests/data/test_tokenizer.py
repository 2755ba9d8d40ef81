import json
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_transformer as kt
from keras_transformer.data import (
    SubwordTokenizer,
    load_tokenizer,
    train_tokenizer,
)


def test_reserved_ids_and_size(small_tokenizer):
    t = small_tokenizer
    assert (t.pad_id, t.unk_id, t.start_id, t.end_id) == (0, 1, 2, 3)
    assert t.vocabulary_size == 400
    assert t.id_to_token([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert t.token_to_id("</s>") == 3
    assert t.token_to_id("not a piece at all") == t.unk_id
    piece = t.id_to_token(100)
    assert isinstance(piece, str) and t.token_to_id(piece) == 100
    with pytest.raises(ValueError, match="outside the vocabulary"):
        t.id_to_token(400)


def test_public_api_is_reachable_from_the_package():
    assert kt.data.train_tokenizer is train_tokenizer
    assert kt.data.load_tokenizer is load_tokenizer
    assert callable(kt.data.translation_dataset)


def test_tokenize_accepts_str_list_and_tensors(small_tokenizer):
    t = small_tokenizer
    sentences = ["A man rides a bike.", "Ein Mann fährt Fahrrad."]
    batch = t.tokenize(sentences)
    assert isinstance(batch, tf.RaggedTensor)
    assert batch.dtype == tf.int32 and batch.shape.rank == 2
    single = t.tokenize(sentences[0])
    np.testing.assert_array_equal(single.numpy(), batch[0].numpy())
    tensor = t.tokenize(tf.constant(sentences))
    assert tensor.to_list() == batch.to_list()
    ids = batch.flat_values.numpy()
    assert ids.min() > t.end_id  # no pad, start or end in the ids
    # Inside a tf.data graph.
    mapped = tf.data.Dataset.from_tensor_slices(sentences).batch(2)
    mapped = mapped.map(t.tokenize)
    assert next(iter(mapped)).to_list() == batch.to_list()


def test_detokenize_accepts_ragged_dense_and_lists(small_tokenizer):
    t = small_tokenizer
    sentences = ["Two dogs.", "A girl walks in the park."]
    ids = t.tokenize(sentences)
    assert t.detokenize(ids) == sentences
    assert t.detokenize(ids.to_list()) == sentences
    assert t.detokenize(ids[1]) == sentences[1]
    assert t.detokenize(ids[1].numpy().tolist()) == sentences[1]
    # Dense, as a decoder emits: start, ids, end, then anything.
    dense = np.zeros([2, 40], np.int32)
    for row, sequence in enumerate(ids.to_list()):
        dense[row, 0] = t.start_id
        dense[row, 1 : 1 + len(sequence)] = sequence
        dense[row, 1 + len(sequence)] = t.end_id
        dense[row, 2 + len(sequence) :] = sequence[0]  # after end: ignored
    assert t.detokenize(dense) == sentences
    assert t.detokenize(tf.constant(dense)) == sentences
    with pytest.raises(ValueError, match="argmax"):
        t.detokenize(np.zeros([2, 3], np.float32))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        t.detokenize(np.zeros([1, 2, 3], np.int32))


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=40))
def test_round_trip_of_any_text(small_tokenizer, text):
    # Identity normalization and byte fallback: any text comes back, even
    # characters the vocabulary never saw.
    t = small_tokenizer
    assert t.detokenize(t.tokenize([text])) == [text]


def test_save_and_load(small_tokenizer, tmp_path):
    directory = tmp_path / "model" / "tokenizer"
    small_tokenizer.save(directory)
    assert sorted(p.name for p in directory.iterdir()) == [
        "tokenizer.json",
        "tokenizer.model",
    ]
    config = json.loads((directory / "tokenizer.json").read_text())
    assert config["vocabulary_size"] == 400 and config["end_id"] == 3
    loaded = load_tokenizer(directory)
    text = ["Zwei Hunde spielen im Park.", "A boy near the house."]
    assert (
        loaded.tokenize(text).to_list()
        == small_tokenizer.tokenize(text).to_list()
    )
    assert loaded.vocabulary_size == small_tokenizer.vocabulary_size
    assert loaded.config["model_type"] == "bpe"


def test_load_errors(small_tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.model"):
        load_tokenizer(tmp_path / "nowhere")
    small_tokenizer.save(tmp_path / "t")
    config_path = tmp_path / "t" / "tokenizer.json"
    config = json.loads(config_path.read_text())
    config["vocabulary_size"] = 999
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="vocabulary_size=999"):
        load_tokenizer(tmp_path / "t")
    config["format_version"] = 42
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="format_version=42"):
        load_tokenizer(tmp_path / "t")


def test_training_errors(small_corpus):
    with pytest.raises(ValueError, match="vocabulary_size=100000 is too"):
        train_tokenizer(list(small_corpus[0]), vocabulary_size=100_000)
    with pytest.raises(ValueError, match="model_type='wordpiece'"):
        train_tokenizer(list(small_corpus[0]), model_type="wordpiece")
    with pytest.raises(ValueError, match="vocabulary_size=200 is too small"):
        train_tokenizer(list(small_corpus[0]), vocabulary_size=200)
    with pytest.raises(ValueError, match="got no text"):
        train_tokenizer([], vocabulary_size=300)
    with pytest.raises(TypeError, match="bytes of a SentencePiece"):
        SubwordTokenizer("not bytes")


def test_unigram_and_sentences(small_corpus):
    sources, targets = small_corpus[1]
    t = train_tokenizer(
        sentences=sources + targets, vocabulary_size=330, model_type="unigram"
    )
    assert t.vocabulary_size == 330
    assert t.detokenize(t.tokenize(sources[:5])) == sources[:5]


def test_multi30k_round_trip(multi30k_paths, multi30k_tokenizer):
    from keras_transformer.data import read_parallel_corpus

    pairs, _ = read_parallel_corpus(*multi30k_paths)
    sentences = [s for pair in pairs for s in pair]
    t = multi30k_tokenizer
    assert t.vocabulary_size == 8000
    restored = t.detokenize(t.tokenize(sentences))
    exact = np.mean([a == b for a, b in zip(sentences, restored, strict=True)])
    print(f"Multi30k train round trip: {exact:.4%} of {len(sentences)}")
    assert exact >= 0.995


def test_survives_a_global_seed_reset(small_tokenizer):
    # keras.utils.set_random_seed clears TensorFlow's kernel cache, which
    # holds the tensorflow-text op's model.
    import keras

    expected = small_tokenizer.tokenize(["A red ball."]).to_list()
    keras.utils.set_random_seed(1)
    assert small_tokenizer.tokenize(["A red ball."]).to_list() == expected
    keras.utils.set_random_seed(2)
    mapped = tf.data.Dataset.from_tensor_slices(["A red ball."]).batch(1)
    mapped = mapped.map(small_tokenizer.tokenize)
    assert next(iter(mapped)).to_list() == expected


# --- the sentencepiece library (encode) and tensorflow-text (tokenize)

EDGE_CASES = [
    "",
    " ",
    "  two  spaces  ",
    "\t",
    "Straße, Ärger, Öl, ß.",
    "日本語のテキスト",
    "emoji 🚲🐕 and a zero-width joiner 👩‍👩‍👧",
    "<s> </s> <pad> <unk>",  # the reserved pieces, as text
    "é composed vs e\u0301 decomposed",
    "A man rides a bike. " * 400,  # very long
]


def _assert_same_ids(tokenizer, sentences):
    ids = tokenizer.encode(sentences)
    assert isinstance(ids, list) and all(isinstance(r, list) for r in ids)
    assert ids == tokenizer.tokenize(sentences).to_list()
    assert tokenizer.detokenize(ids) == tokenizer.detokenize(
        tokenizer.tokenize(sentences)
    )
    for sentence, row in zip(sentences, ids, strict=True):
        assert tokenizer.encode(sentence) == row
        assert tokenizer.detokenize(row) == tokenizer.detokenize(
            tokenizer.tokenize(sentence)
        )


def test_encode_equals_tokenize_on_multi30k(multi30k_paths, multi30k_tokenizer):
    from keras_transformer.data import read_parallel_corpus

    pairs, _ = read_parallel_corpus(*multi30k_paths)
    rng = np.random.default_rng(30)
    picked = rng.choice(len(pairs), size=500, replace=False)
    sentences = [pairs[i][side] for i in picked for side in (0, 1)]
    _assert_same_ids(multi30k_tokenizer, sentences + EDGE_CASES)
    ids = multi30k_tokenizer.encode(EDGE_CASES)
    assert ids[0] == [] and len(ids[-1]) > 1000
    assert min(min(row) for row in ids if row) > multi30k_tokenizer.end_id


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(st.characters(exclude_categories=["Cs"])),
        min_size=1,
        max_size=4,
    )
)
def test_encode_equals_tokenize_on_any_text(small_tokenizer, sentences):
    _assert_same_ids(small_tokenizer, sentences)
    # Identity normalization and byte fallback: the text comes back (an
    # empty list would read as one empty sequence).
    assert small_tokenizer.detokenize(small_tokenizer.encode(sentences)) == (
        sentences
    )


@pytest.mark.parametrize("bad", [7, None, ["a", 3], [b"bytes"]])
def test_encode_refuses_what_is_not_text(small_tokenizer, bad):
    with pytest.raises(TypeError, match="encode expects a str or a list"):
        small_tokenizer.encode(bad)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"not a sentencepiece model\n" * 3, "its 78 bytes do not parse"),
        (b"", "it is empty"),
    ],
)
def test_garbage_model_file_is_named(
    small_tokenizer, tmp_path, content, problem
):
    small_tokenizer.save(tmp_path / "t")
    path = tmp_path / "t" / "tokenizer.model"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        load_tokenizer(tmp_path / "t")
    message = str(error.value)
    assert message.startswith(f"{path} is not a SentencePiece model: ")
    assert problem in message and "re-download" in message
    assert "\n" not in message
    with pytest.raises(ValueError, match="proto is not a SentencePiece"):
        SubwordTokenizer(content)


def test_config_that_is_not_an_object_is_named(small_tokenizer, tmp_path):
    small_tokenizer.save(tmp_path / "t")
    path = tmp_path / "t" / "tokenizer.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"{path} holds a JSON list"):
        load_tokenizer(tmp_path / "t")


def test_loading_and_encoding_import_no_tensorflow(small_tokenizer, tmp_path):
    # A fresh interpreter: this one imported TensorFlow for the tests
    # above.
    import subprocess
    import sys

    small_tokenizer.save(tmp_path / "t")
    script = (
        "import sys; from keras_transformer.data import load_tokenizer; "
        f"t = load_tokenizer({str(tmp_path / 't')!r}); "
        "ids = t.encode(['A man rides a bike.', 'Zwei Hunde.']); "
        "print(ids, t.detokenize(ids), "
        "sorted(m for m in sys.modules if m.startswith('tensorflow')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
    )
    sentences = ["A man rides a bike.", "Zwei Hunde."]
    expected = small_tokenizer.tokenize(sentences).to_list()
    assert result.stdout.strip() == f"{expected} {sentences} []"


# --- tensorflow-text's SentencePiece logs as quietly as TensorFlow

INFO_LINE = (
    "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity "
    "normalization."
)


@pytest.mark.parametrize(
    ("level", "shown", "vocabulary_size"),
    [("3", False, 331), ("1", False, 332), ("0", True, 333), ("", True, 334)],
)
def test_the_ops_info_line_follows_tensorflows_log_level(
    level, shown, vocabulary_size, small_corpus, monkeypatch, capfd
):
    # The op logs when it first loads a model (TensorFlow then caches its
    # kernel): a vocabulary size of its own gives each case a new model.
    tokenizer = train_tokenizer(list(small_corpus[0]), vocabulary_size)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
    capfd.readouterr()
    ids = tokenizer.tokenize(["A red ball."]).to_list()
    err = capfd.readouterr().err
    assert ids == [tokenizer.encode("A red ball.")]
    logged = [line for line in err.splitlines() if "LOG(INFO)" in line]
    assert logged == ([INFO_LINE] if shown else [])


def test_other_lines_written_while_the_op_loads_are_kept(
    small_corpus, monkeypatch, capfd
):
    from keras_transformer.data import tokenizer as module

    tokenizer = train_tokenizer(list(small_corpus[0]), vocabulary_size=335)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    capfd.readouterr()
    with module._sentencepiece_info_hidden():
        os.write(2, b"first line\n")
        tokenizer._new_tf_tokenizer()
        os.write(2, b"last line, no newline")
    assert capfd.readouterr().err == "first line\nlast line, no newline"
