"""Decoding a `Transformer`: cache, beam search, scores and lengths."""

import numpy as np
import pytest

from keras_transformer.generation import Generator, hypothesis_lengths
from tests.generation.conftest import (
    END,
    PAD,
    TRAINED_MAX_LENGTH,
    VOCABULARY_SIZE,
)


@pytest.fixture(scope="module")
def random_sources():
    rng = np.random.default_rng(7)
    # Source bucket 8 and max_length=12, like the trained model's tests:
    # the tests of the random weights reuse one set of compiled searches.
    ids = rng.integers(4, VOCABULARY_SIZE, (10, 8)).astype("int32")
    lengths = np.array([8, 3, 6, 1, 7, 2, 5, 8, 4, 6])
    for row, length in enumerate(lengths):
        ids[row, length - 1] = END
        ids[row, length:] = PAD
    return ids, (ids != PAD).astype("int32")


SEARCHES = [
    ("greedy", {}),
    ("beam", {"beam_size": 4, "num_return_sequences": 3}),
    ("sample", {"seed": 3, "top_k": 10, "num_return_sequences": 3}),
]


@pytest.mark.parametrize("method,settings", SEARCHES, ids=lambda x: str(x))
def test_cached_decoding_equals_full_rerun(
    random_generator, random_sources, method, settings
):
    ids, mask = random_sources
    generator = random_generator
    cached = generator.generate(
        ids, mask, method=method, max_length=TRAINED_MAX_LENGTH, **settings
    )
    full = generator.generate(
        ids,
        mask,
        method=method,
        max_length=TRAINED_MAX_LENGTH,
        use_cache=False,
        **settings,
    )
    np.testing.assert_array_equal(cached.token_ids, full.token_ids)
    np.testing.assert_array_equal(cached.lengths, full.lengths)
    np.testing.assert_allclose(cached.scores, full.scores, atol=1e-4)
    # Untrained: outputs run to the limit, so every step was compared.
    assert cached.lengths.max() == 12


@pytest.mark.slow
def test_cached_decoding_equals_full_rerun_on_trained_model(
    trained_generator, test_batch
):
    ids, mask = test_batch
    generator = trained_generator
    for method in ("greedy", "beam"):
        kwargs = dict(method=method, max_length=TRAINED_MAX_LENGTH)
        cached = generator.generate(ids, mask, **kwargs)
        full = generator.generate(ids, mask, use_cache=False, **kwargs)
        np.testing.assert_array_equal(cached.token_ids, full.token_ids)
        np.testing.assert_allclose(cached.scores, full.scores, atol=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_equals_greedy(trained_generator, test_batch, alpha):
    ids, mask = test_batch
    generator = trained_generator
    kwargs = dict(length_penalty=alpha, max_length=TRAINED_MAX_LENGTH)
    greedy = generator.generate(ids, mask, method="greedy", **kwargs)
    beam = generator.generate(ids, mask, method="beam", beam_size=1, **kwargs)
    np.testing.assert_array_equal(beam.token_ids, greedy.token_ids)
    np.testing.assert_array_equal(beam.lengths, greedy.lengths)
    np.testing.assert_allclose(beam.scores, greedy.scores, atol=1e-5)


def test_beam_scores_at_least_greedy_and_equal_model_scoring(
    trained_generator, test_batch
):
    ids, mask = test_batch
    generator = trained_generator
    kwargs = dict(length_penalty=0.6, max_length=TRAINED_MAX_LENGTH)
    greedy = generator.generate(ids, mask, method="greedy", **kwargs)
    beam = generator.generate(
        ids, mask, method="beam", beam_size=4, num_return_sequences=4, **kwargs
    )
    # The paper's objective: length-normalized log-probability.
    assert beam.scores[:, 0].mean() >= greedy.scores[:, 0].mean()
    # Best first.
    assert (np.diff(beam.scores, axis=1) <= 1e-6).all()
    # Every returned hypothesis, rescored by a full forward pass of the
    # model (teacher forcing), has the score the search reported.
    for rank in range(4):
        log_probs, lengths, scores = generator.score(
            ids, beam.token_ids[:, rank], mask, length_penalty=0.6
        )
        np.testing.assert_array_equal(lengths, beam.lengths[:, rank])
        np.testing.assert_allclose(
            log_probs, beam.log_probs[:, rank], atol=1e-4
        )
        np.testing.assert_allclose(scores, beam.scores[:, rank], atol=1e-4)
    log_probs, _, scores = generator.score(
        ids, greedy.token_ids[:, 0], mask, length_penalty=0.6
    )
    np.testing.assert_allclose(scores, greedy.scores[:, 0], atol=1e-4)


def test_length_penalty_lengthens_outputs(trained_generator, test_batch):
    ids, mask = test_batch
    generator = trained_generator
    lengths = {
        alpha: generator.generate(
            ids,
            mask,
            method="beam",
            length_penalty=alpha,
            max_length=TRAINED_MAX_LENGTH,
        ).lengths[:, 0]
        for alpha in (0.0, 0.6, 3.0)
    }
    # Documented direction: a larger alpha gives longer (or equal) outputs.
    assert lengths[0.6].mean() >= lengths[0.0].mean()
    assert lengths[3.0].mean() >= lengths[0.6].mean()
    assert lengths[3.0].mean() > lengths[0.0].mean()


def test_finished_hypotheses_never_grow(random_generator, random_sources):
    ids, mask = random_sources
    result = random_generator.generate(
        ids, mask, beam_size=4, num_return_sequences=4, max_length=12
    )
    limits = np.full((len(ids),), 12)
    for row in range(len(ids)):
        for rank in range(4):
            tokens = result.token_ids[row, rank]
            length = result.lengths[row, rank]
            ends = np.flatnonzero(tokens == END)
            # At most one end token, last; padding after the hypothesis.
            assert len(ends) <= 1
            if len(ends):
                assert ends[0] == length - 1
            else:
                assert length == limits[row]
            assert (tokens[length:] == PAD).all()
            assert (tokens[:length] != PAD).all()
    np.testing.assert_array_equal(
        hypothesis_lengths(result.token_ids[:, 0]), result.lengths[:, 0]
    )


def test_default_max_length_is_input_length_plus_offset(
    random_generator, random_sources
):
    ids, mask = random_sources
    # Source bucket 8 + offset 4: the buffer of the max_length=12 tests,
    # so this reuses their compiled search with per-row limits.
    result = random_generator.generate(
        ids, mask, method="greedy", max_length_offset=4
    )
    source_lengths = mask.sum(axis=1)
    assert (result.lengths[:, 0] <= source_lengths + 4).all()
    # The untrained model rarely ends: most rows hit their own limit.
    assert (result.lengths[:, 0] == source_lengths + 4).sum() >= 5


def test_compiles_once_per_bucket(random_generator, random_sources):
    ids, mask = random_sources
    generator = random_generator
    kwargs = dict(method="greedy", max_length=12)
    first = generator.generate(ids, mask, **kwargs)
    count = len(generator._functions)
    # Another batch size and source length in the same buckets, and
    # another length penalty (a runtime argument): no new program.
    rows = [0, 2, 4, 1, 3, 0, 2, 9, 8, 5, 6, 7]
    again = generator.generate(ids[rows], mask[rows], **kwargs)
    generator.generate(ids[:, :7], mask[:, :7], length_penalty=0.1, **kwargs)
    assert len(generator._functions) == count
    # Padding a batch to its bucket (6 filler rows, then 4) changes no
    # row's result.
    np.testing.assert_array_equal(again.token_ids, first.token_ids[rows])
    np.testing.assert_array_equal(again.lengths, first.lengths[rows])


@pytest.mark.parametrize("method,settings", SEARCHES, ids=lambda x: str(x))
def test_a_lone_source_finds_what_it_finds_in_a_batch(
    random_generator, random_sources, method, settings
):
    # On TensorFlow's XLA for the CPU a lone source with one hypothesis
    # is searched with the cache beside a filler row (the
    # ``tensorflow_filler_row`` fast path, `backends.search_rows`).
    from keras_transformer import backends

    ids, mask = random_sources
    generator = random_generator
    kwargs = dict(method=method, max_length=TRAINED_MAX_LENGTH, **settings)
    if method == "sample":
        kwargs["num_return_sequences"] = 1
    alone = generator.generate(ids[:1], mask[:1], **kwargs)
    uncached = generator.generate(ids[:1], mask[:1], use_cache=False, **kwargs)
    # Sampling draws as a one-source bucket does, filler or not: the
    # cached search samples what the uncached one does.
    np.testing.assert_array_equal(alone.token_ids, uncached.token_ids)
    np.testing.assert_allclose(alone.scores, uncached.scores, atol=1e-4)
    if method != "sample":
        # (Samples are drawn per source of the bucket.)
        batch = generator.generate(ids[:2], mask[:2], **kwargs)
        np.testing.assert_array_equal(alone.token_ids, batch.token_ids[:1])
        np.testing.assert_array_equal(alone.lengths, batch.lengths[:1])
        np.testing.assert_allclose(alone.scores, batch.scores[:1], atol=1e-5)
    # Programs compiled: (method, cached, batch bucket, rows per source).
    rows = 4 if method == "beam" else 1
    programs = {
        (k.method, k.use_cache, k.batch_size, k.copies)
        for k in generator._functions
    }
    assert (method, False, 1, rows) in programs
    filler = backends.search_rows(rows, True, generator.jit_compile) == 2
    assert ((method, True, 1, rows) in programs) != filler
    assert ((method, True, 2, rows) in programs) or not filler


@pytest.mark.parametrize("layout", [None, "split", "stacked"])
def test_cache_layouts_find_the_same_hypotheses(
    trained_generator, test_batch, layout, monkeypatch
):
    """Split caches by default (one query attending by matrix-vector
    products, or torch's cached decoder step writing them in place);
    either layout on any backend finds the same hypotheses."""
    from keras_transformer.layers import MultiHeadAttention

    one_query = MultiHeadAttention._one_query_attention
    calls = []

    def counted(self, *args):
        calls.append(1)
        return one_query(self, *args)

    monkeypatch.setattr(MultiHeadAttention, "_one_query_attention", counted)
    generator = Generator(trained_generator.model, cache_layout=layout)
    from keras_transformer import backends

    fast = backends.enabled("torch_decoder")
    expected_layout = layout or "split"
    assert generator.cache_layout == expected_layout
    ids, mask = test_batch
    kwargs = dict(method="beam", beam_size=2, max_length=5)
    result = generator.generate(ids[:3], mask[:3], **kwargs)
    assert bool(calls) == (expected_layout == "split" and not fast)
    full = trained_generator.generate(
        ids[:3], mask[:3], use_cache=False, **kwargs
    )
    np.testing.assert_array_equal(result.token_ids, full.token_ids)
    np.testing.assert_allclose(result.scores, full.scores, atol=1e-4)


def test_sampling(trained_generator, test_batch):
    ids, mask = test_batch
    generator = trained_generator
    kwargs = dict(
        method="sample",
        num_return_sequences=3,
        top_k=10,
        temperature=1.5,
        max_length=TRAINED_MAX_LENGTH,
    )
    first = generator.generate(ids, mask, seed=1, **kwargs)
    again = generator.generate(ids, mask, seed=1, **kwargs)
    other = generator.generate(ids, mask, seed=2, **kwargs)
    np.testing.assert_array_equal(first.token_ids, again.token_ids)
    assert (first.token_ids != other.token_ids).any()
    # Samples' scores are the model's own (untempered) scores.
    log_probs, _, _ = generator.score(ids, first.token_ids[:, 1], mask)
    np.testing.assert_allclose(log_probs, first.log_probs[:, 1], atol=1e-4)
    # top_k=1 leaves one candidate: sampling becomes greedy search.
    top1 = generator.generate(
        ids,
        mask,
        method="sample",
        top_k=1,
        seed=4,
        max_length=TRAINED_MAX_LENGTH,
    )
    greedy = generator.generate(
        ids, mask, method="greedy", max_length=TRAINED_MAX_LENGTH
    )
    np.testing.assert_array_equal(top1.token_ids, greedy.token_ids)


def test_bad_cache_layout(trained_generator):
    with pytest.raises(ValueError, match="cache_layout='paged'"):
        Generator(trained_generator.model, cache_layout="paged")


def test_bad_arguments(random_generator):
    generator = random_generator
    ids = np.array([[5, 6, END]], "int32")
    with pytest.raises(ValueError, match="method='topk'"):
        generator.generate(ids, method="topk")
    with pytest.raises(ValueError, match="num_return_sequences=5"):
        generator.generate(ids, beam_size=4, num_return_sequences=5)
    with pytest.raises(ValueError, match="max_sequence_length=32"):
        generator.generate(np.ones((1, 40), "int32"))
    with pytest.raises(ValueError, match="max_length=99"):
        generator.generate(ids, max_length=99)
    with pytest.raises(ValueError, match="dtype <U1; they must be integers"):
        generator.generate(np.array([["a", "b"]]))
    with pytest.raises(ValueError, match="temperature=0"):
        generator.generate(ids, method="sample", temperature=0)
    for name, value, usual in (
        ("temperature", float("nan"), "1 leaves the probabilities as they are"),
        ("top_p", float("inf"), "1 disables the filter"),
        ("length_penalty", float("nan"), "0.6 in the paper; 0 disables it"),
    ):
        with pytest.raises(ValueError) as caught:
            generator.generate(ids, method="sample", **{name: value})
        assert str(caught.value) == (
            f"{name}={value} must be a finite number ({usual})."
        )


def _plant(rng, ids, value):
    """``ids`` with ``value`` at a random entry and in every later row:
    the random entry is the first bad one. Returns it and its index."""
    bad = ids.astype("float64" if isinstance(value, float) else "int32")
    row = int(rng.integers(0, bad.shape[0]))
    column = int(rng.integers(0, bad.shape[1]))
    bad[row, column] = value
    bad[row + 1 :, :] = value
    return bad, row, column


@pytest.mark.parametrize(
    "value, what",
    [
        (VOCABULARY_SIZE, f"is outside \\[0, {VOCABULARY_SIZE}\\)"),
        (-2, f"is outside \\[0, {VOCABULARY_SIZE}\\)"),
        (4.5, "is not a whole number"),
    ],
)
def test_bad_source_and_target_ids_are_named_at_their_position(
    random_generator, random_sources, value, what
):
    """`generate` and `score` name the first id outside the vocabulary
    (or fractional) by its position, before anything runs."""
    generator = random_generator
    ids, mask = random_sources
    targets = ids[:, :4]
    rng = np.random.default_rng(abs(int(value)))
    for _ in range(4):
        bad, row, column = _plant(rng, ids, value)
        message = rf"^encoder_token_ids\[{row}, {column}\] = {value} {what}"
        with pytest.raises(ValueError, match=message):
            generator.generate(bad, method="greedy", max_length=4)
        with pytest.raises(ValueError, match=message):
            generator.score(bad, targets, mask)
        bad, row, column = _plant(rng, targets, value)
        message = rf"^target_token_ids\[{row}, {column}\] = {value} {what}"
        with pytest.raises(ValueError, match=message):
            generator.score(ids, bad)


def test_padding_mask_of_generate_must_be_0_or_1(
    random_generator, random_sources
):
    ids, mask = random_sources
    half = mask.astype("float32")
    half[4, 2] = 0.5
    with pytest.raises(
        ValueError, match=r"^encoder_padding_mask\[4, 2\] = 0.5 is not 0 or 1"
    ):
        random_generator.generate(ids, half, method="greedy", max_length=4)
