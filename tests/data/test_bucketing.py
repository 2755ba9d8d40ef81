import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_transformer.data import BatchPlanner, learn_bucket_shapes

lengths = st.lists(
    st.tuples(st.integers(2, 90), st.integers(2, 90)), min_size=1, max_size=300
)


@settings(max_examples=40, deadline=None)
@given(lengths, st.integers(1, 16))
def test_learned_shapes_hold_every_pair(pairs, num_buckets):
    source, target = np.array(pairs).T
    shapes = learn_bucket_shapes(source, target, num_buckets)
    assert 1 <= len(shapes) <= num_buckets
    assert shapes[-1] == (source.max(), target.max())
    for s, t in pairs:
        assert any(s <= a and t <= b for a, b in shapes)


def test_more_buckets_waste_less_padding():
    rng = np.random.default_rng(0)
    source = rng.integers(3, 60, 2000)
    target = np.clip(source + rng.integers(-4, 5, 2000), 2, None)

    def padding(shapes):
        best = [
            min(a + b for a, b in shapes if s <= a and t <= b) - s - t
            for s, t in zip(source, target, strict=True)
        ]
        return sum(best)

    wastes = [
        padding(learn_bucket_shapes(source, target, k)) for k in (1, 4, 16)
    ]
    assert wastes[0] > wastes[1] > wastes[2]


@settings(max_examples=40, deadline=None)
@given(
    lengths,
    st.integers(90, 2000),
    st.booleans(),
    st.integers(0, 3),
)
def test_every_pair_once_per_epoch_within_budget(
    pairs, max_tokens, shuffle, epoch
):
    source, target = np.array(pairs).T
    shapes = learn_bucket_shapes(source, target, 6)
    planner = BatchPlanner(source, target, shapes, max_tokens)
    batches = planner.batches(epoch, shuffle=shuffle, seed=7)
    assert len(batches) == planner.num_batches
    seen = np.concatenate([indices for _, indices in batches])
    np.testing.assert_array_equal(np.sort(seen), np.arange(len(pairs)))
    for bucket, indices in batches:
        size, s, t = planner.batch_shapes[bucket]
        assert size * s <= max_tokens and size * t <= max_tokens
        assert 1 <= len(indices) <= size
        assert (source[indices] <= s).all() and (target[indices] <= t).all()
    # Only batches that no larger bucket could complete are short.
    short = [
        b for b, indices in batches if len(indices) < planner.batch_sizes[b]
    ]
    assert len(short) <= len(planner)
    again = planner.batches(epoch, shuffle=shuffle, seed=7)
    assert all(
        a == c and np.array_equal(b, d)
        for (a, b), (c, d) in zip(batches, again, strict=True)
    )


def test_planner_errors():
    with pytest.raises(ValueError, match="max_tokens=10 cannot hold"):
        BatchPlanner([5], [30], [(30, 30)], max_tokens=10)
    with pytest.raises(ValueError, match="fit no bucket"):
        BatchPlanner([5, 40], [5, 8], [(16, 16)], max_tokens=100)
    with pytest.raises(ValueError, match="empty corpus"):
        learn_bucket_shapes([], [])
