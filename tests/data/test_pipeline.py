import logging

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data import (
    batch_statistics,
    read_lines,
    translation_dataset,
)


def expected_ids(tokenizer, sources, targets):
    """source token ids (as a tuple) -> target token ids."""
    source_ids = tokenizer.tokenize(sources).to_list()
    target_ids = tokenizer.tokenize(targets).to_list()
    return {tuple(s): t for s, t in zip(source_ids, target_ids, strict=True)}


def strip_padding(row, mask):
    # Real tokens first, padding after, and the mask says which is which.
    length = int(mask.sum())
    np.testing.assert_array_equal(mask[:length], 1)
    np.testing.assert_array_equal(mask[length:], 0)
    np.testing.assert_array_equal(row[length:], 0)
    assert (row[:length] != 0).all()
    return row[:length].tolist()


@pytest.mark.parametrize("max_tokens", [64, 300])
def test_every_batch_lines_up_with_the_tokens(
    small_corpus, small_tokenizer, max_tokens
):
    t = small_tokenizer
    sources, targets = small_corpus[1]
    expected = expected_ids(t, sources, targets)
    ds = translation_dataset(
        *small_corpus[0], t, max_tokens=max_tokens, shuffle=True, seed=3
    )
    seen = []
    for inputs, labels, weights in ds.as_numpy_iterator():
        encoder = inputs["encoder_token_ids"]
        decoder = inputs["decoder_token_ids"]
        assert encoder.dtype == decoder.dtype == labels.dtype == np.int32
        assert inputs["encoder_padding_mask"].dtype == np.int32
        assert weights.dtype == np.float32
        batch, source_length = encoder.shape
        assert decoder.shape == labels.shape == weights.shape
        assert decoder.shape[0] == batch
        # The token budget, per side, padding included.
        assert encoder.size <= max_tokens and decoder.size <= max_tokens
        np.testing.assert_array_equal(
            weights, inputs["decoder_padding_mask"].astype(np.float32)
        )
        for row in range(batch):
            source = strip_padding(
                encoder[row], inputs["encoder_padding_mask"][row]
            )
            target_in = strip_padding(
                decoder[row], inputs["decoder_padding_mask"][row]
            )
            label = strip_padding(labels[row], weights[row])
            if not source:  # an empty row that pads the last batch
                assert not target_in and not label
                continue
            assert source[-1] == t.end_id
            target = expected[tuple(source[:-1])]
            assert target_in == [t.start_id] + target
            assert label == target + [t.end_id]
            seen.append(tuple(source[:-1]))
    # Every pair exactly once in the epoch.
    assert sorted(seen) == sorted(expected)
    assert ds.corpus_stats.kept == len(sources)


def test_same_seed_same_batches_and_new_epochs(small_corpus, small_tokenizer):
    def epochs(seed, count=2):
        ds = translation_dataset(
            *small_corpus[0],
            small_tokenizer,
            max_tokens=400,
            seed=seed,
            deterministic=True,
        )
        return [
            [b[0]["encoder_token_ids"] for b in ds.as_numpy_iterator()]
            for _ in range(count)
        ]

    def same(a, b):
        return len(a) == len(b) and all(
            x.shape == y.shape and (x == y).all()
            for x, y in zip(a, b, strict=True)
        )

    first, second = epochs(0), epochs(0)
    assert same(first[0], second[0]) and same(first[1], second[1])
    assert not same(first[0], first[1])  # epochs are reshuffled
    assert not same(first[0], epochs(1, count=1)[0])


def test_unshuffled_follows_corpus_order(small_corpus, small_tokenizer):
    sources, targets = small_corpus[1]
    ds = translation_dataset(
        sources, targets, small_tokenizer, max_tokens=128, shuffle=False
    )
    # Order of first appearance of each bucket's pairs: ascending.
    firsts = []
    ids = small_tokenizer.tokenize(sources).to_list()
    index = {tuple(s): i for i, s in enumerate(ids)}
    for inputs, _, _ in ds.as_numpy_iterator():
        rows = inputs["encoder_token_ids"]
        masks = inputs["encoder_padding_mask"]
        firsts.append(
            min(
                index[tuple(r[: m.sum() - 1])]
                for r, m in zip(rows, masks, strict=True)
                if m.sum()
            )
        )
    assert firsts == sorted(firsts)


def test_long_and_empty_pairs_are_dropped_and_counted(small_tokenizer, caplog):
    sources = ["A dog.", "", "a " * 40, "A red ball.", "Two girls."]
    targets = ["Ein Hund.", "Leer.", "Lang.", "", "Zwei Mädchen."]
    with caplog.at_level(logging.WARNING):
        ds = translation_dataset(
            sources, targets, small_tokenizer, max_tokens=64, max_length=20
        )
    stats = ds.corpus_stats
    assert (stats.read, stats.kept) == (5, 2)
    assert (stats.dropped_empty, stats.dropped_too_long) == (2, 1)
    assert "longer than max_length=20" in caplog.text
    assert batch_statistics(ds).num_batches >= 1
    rows = sum(
        int(w.sum(axis=1).astype(bool).sum())
        for _, _, w in ds.as_numpy_iterator()
    )
    assert rows == 2


def test_bad_arguments(small_corpus, small_tokenizer):
    paths = small_corpus[0]
    with pytest.raises(ValueError, match="both be file paths"):
        translation_dataset(paths[0], ["a"], small_tokenizer)
    with pytest.raises(ValueError, match="source has 2 sentences"):
        translation_dataset(["a", "b"], ["c"], small_tokenizer)
    with pytest.raises(ValueError, match=r"source\[1\] is a bytes"):
        translation_dataset(["a", b"b"], ["c", "d"], small_tokenizer)
    with pytest.raises(ValueError, match="max_tokens=8 cannot hold"):
        translation_dataset(*paths, small_tokenizer, max_tokens=8)
    with pytest.raises(ValueError, match="No sentence pair is under"):
        translation_dataset(*paths, small_tokenizer, max_length=2)
    with pytest.raises(FileNotFoundError, match="nope.en"):
        translation_dataset("nope.en", paths[1], small_tokenizer)


def test_fixed_length_padding_and_repeat(small_corpus, small_tokenizer):
    buckets = translation_dataset(
        *small_corpus[0], small_tokenizer, max_tokens=256, seed=0
    )
    fixed = translation_dataset(
        *small_corpus[0],
        small_tokenizer,
        max_tokens=256,
        seed=0,
        bucket_boundaries=[48],
    )
    bucket_stats, fixed_stats = (
        batch_statistics(buckets),
        batch_statistics(fixed),
    )
    assert fixed_stats.num_shapes == 1 and fixed_stats.shapes[0][1:] == (48, 48)
    assert bucket_stats.num_shapes <= 16
    assert bucket_stats.real_tokens == fixed_stats.real_tokens
    assert bucket_stats.padding_fraction < fixed_stats.padding_fraction / 2
    repeated = translation_dataset(
        *small_corpus[0], small_tokenizer, max_tokens=256, seed=0, repeat=True
    )
    many = batch_statistics(repeated, num_batches=3 * bucket_stats.num_batches)
    assert many.num_batches == 3 * bucket_stats.num_batches


def test_feeds_model_fit(small_corpus, small_tokenizer):
    # One shape: one compilation of the train step.
    ds = translation_dataset(
        *small_corpus[0],
        small_tokenizer,
        max_tokens=1024,
        seed=0,
        num_buckets=1,
    )
    assert len(ds.batch_shapes) == 1
    model = kt.Transformer(
        vocabulary_size=small_tokenizer.vocabulary_size,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        dropout=0.0,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(ds, epochs=2, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert losses[1] < losses[0]


def test_multi30k_padding_and_shapes(multi30k_paths, multi30k_tokenizer):
    ds = translation_dataset(
        *multi30k_paths, multi30k_tokenizer, max_tokens=4096, seed=0
    )
    stats = batch_statistics(ds)
    print(
        f"Multi30k: padding {stats.padding_fraction:.2%}, "
        f"{stats.num_shapes} shapes, {stats.num_batches} batches"
    )
    assert stats.padding_fraction <= 0.10
    assert stats.num_shapes <= 16
    assert stats.max_batch_tokens <= 4096
    targets = read_lines(multi30k_paths[1])
    target_ids = multi30k_tokenizer.tokenize(targets).row_lengths().numpy()
    assert stats.target_tokens == int(target_ids.sum()) + len(targets)


class CodePointTokenizer:
    """A tokenizer of Unicode code points that declares an ASCII
    vocabulary: any other character gets an id outside it."""

    vocabulary_size = 128

    def tokenize(self, sentences):
        import tensorflow as tf

        return tf.strings.unicode_decode(sentences, "UTF-8")


@pytest.mark.parametrize("side", ["source", "target"])
def test_id_outside_the_tokenizer_vocabulary_is_named(side):
    """The first id at or above the tokenizer's vocabulary_size is named
    by sentence and position before any batch is built (the model would
    read no embedding row for it)."""
    rng = np.random.default_rng(0 if side == "source" else 1)
    for _ in range(3):
        num_pairs = int(rng.integers(2, 9))
        sentences = {
            name: [
                " ".join(rng.choice(["a", "dog", "runs", "two"], 3))
                for _ in range(num_pairs)
            ]
            for name in ("source", "target")
        }
        row = int(rng.integers(0, len(sentences[side])))
        column = int(rng.integers(0, len(sentences[side][row]) + 1))
        sentence = sentences[side][row]
        sentences[side][row] = sentence[:column] + "é" + sentence[column:]
        # A later character is bad too: the first one is reported.
        sentences[side][-1] += "ß"
        with pytest.raises(
            ValueError,
            match=rf"^{side}_ids\[{row}, {column}\] = 233 is outside "
            r"\[0, 128\): the tokenizer gave token",
        ):
            translation_dataset(
                sentences["source"],
                sentences["target"],
                CodePointTokenizer(),
                max_tokens=64,
            )
