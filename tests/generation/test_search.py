"""The search algorithms on toy Markov models, against exhaustive search.

A toy model's next-token logits depend on the step and the previous token
only (a table per source row), so every hypothesis's score is known in
closed form and small vocabularies can be searched exhaustively.
"""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keras import ops

from keras_transformer import backends
from keras_transformer.generation import search

PAD, UNK, START, END = 0, 1, 2, 3


def _toy_step(sequences, index, cache, constants):
    # tables: (rows, max_length, V, V); logits = tables[row, index, last].
    table = ops.take(constants["tables"], index, axis=1)  # (rows, V, V)
    last = ops.take(sequences, ops.reshape(index, (1,)), axis=1)  # (rows, 1)
    vocabulary_size = table.shape[-1]
    last = ops.broadcast_to(
        last[:, :, None], (last.shape[0], 1, vocabulary_size)
    )
    return ops.take_along_axis(table, last, axis=1)[:, 0, :], cache


_FUNCTIONS = {}


def run_search(tables, limits, method, alpha=0.0, beam_size=4, n=1):
    """Runs a compiled search over toy ``tables`` (batch, N, V, V)."""
    batch, max_length, vocabulary_size, _ = tables.shape
    key = (method, batch, max_length, vocabulary_size, beam_size, n)
    if key not in _FUNCTIONS:
        banned = search.banned_logits(vocabulary_size, (PAD, START))

        def fn(tables, limits, alpha):
            common = dict(
                step_fn=_toy_step,
                cache={},
                max_length=max_length,
                row_max_lengths=limits,
                start_id=START,
                end_id=END,
                pad_id=PAD,
                banned=banned,
                alpha=alpha,
            )
            if method == "greedy":
                return search.greedy_search(
                    constants={"tables": tables}, batch_size=batch, **common
                )
            return search.beam_search(
                constants={"tables": ops.repeat(tables, beam_size, axis=0)},
                batch_size=batch,
                beam_size=beam_size,
                num_return_sequences=n,
                **common,
            )

        _FUNCTIONS[key] = backends.compile_search(fn, None)
    outputs = _FUNCTIONS[key](
        ops.convert_to_tensor(tables),
        ops.convert_to_tensor(limits),
        ops.convert_to_tensor(np.float32(alpha)),
    )
    return {k: ops.convert_to_numpy(v) for k, v in outputs._asdict().items()}


def log_softmax(x):
    x = x.astype("float64")
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def toy_log_prob(table, tokens):
    """Sum of log-probabilities of ``tokens`` under one row's table."""
    previous, total = START, 0.0
    for step, token in enumerate(tokens):
        total += log_softmax(table[step, previous])[token]
        previous = token
    return total


def exhaustive(table, limit, alpha, allowed):
    """Every hypothesis: (normalized score, log-prob, tokens), best first."""
    hypotheses = []
    others = [t for t in allowed if t != END]
    for length in range(1, limit + 1):
        for body in itertools.product(others, repeat=length - 1):
            hypotheses.append(body + (END,))
            if length == limit:
                hypotheses.extend(body + (last,) for last in others)
    results = []
    for tokens in hypotheses:
        log_prob = toy_log_prob(table, tokens)
        penalty = ((5 + len(tokens)) / 6) ** alpha
        results.append((log_prob / penalty, log_prob, tokens))
    return sorted(results, reverse=True)


def random_tables(seed, batch, max_length, vocabulary_size, scale=2.0):
    rng = np.random.default_rng(seed)
    shape = (batch, max_length, vocabulary_size, vocabulary_size)
    tables = rng.normal(0.0, scale, shape).astype("float32")
    return tables


def tokens_of(row_ids, length):
    return tuple(int(t) for t in row_ids[:length])


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**31 - 1),
    alpha=st.sampled_from([0.0, 0.6, 1.5]),
    limits=st.lists(st.integers(1, 4), min_size=3, max_size=3),
)
def test_beam_search_with_a_wide_beam_is_exhaustive(seed, alpha, limits):
    # V=5 with pad and start banned leaves {unk, end, 4}: at most 4 alive
    # prefixes before the last step, 12 extensions of them, so a beam of
    # 12 never prunes and must find the exact n-best under the length
    # penalty, early stopping included.
    tables = random_tables(seed, 3, 4, 5)
    limits = np.array(limits, "int32")
    out = run_search(tables, limits, "beam", alpha=alpha, beam_size=12, n=3)
    for row in range(3):
        expected = exhaustive(tables[row], limits[row], alpha, (UNK, END, 4))
        for rank in range(3):
            score, log_prob, tokens = expected[rank]
            got = tokens_of(
                out["token_ids"][row, rank], out["lengths"][row, rank]
            )
            assert got == tokens
            assert out["lengths"][row, rank] == len(tokens)
            # float32 log-softmax against float64: an absolute error of a
            # few ulps of the logits, which near-certain tokens (log
            # probabilities near 0) make large relative to the value.
            np.testing.assert_allclose(
                out["scores"][row, rank], score, rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(
                out["log_probs"][row, rank], log_prob, rtol=1e-5, atol=1e-6
            )
            # Nothing after the hypothesis: finished ones never grow.
            assert (out["token_ids"][row, rank, len(tokens) :] == PAD).all()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_greedy_matches_reference_and_beam_of_one(seed):
    # The shapes of the other (4, 6, 9) tests: the same compiled searches.
    tables = random_tables(seed, 4, 6, 9, scale=1.5)
    limits = np.array([6, 3, 1, 5], "int32")
    greedy = run_search(tables, limits, "greedy")
    beam = run_search(tables, limits, "beam", alpha=0.6, beam_size=1)
    for row in range(4):
        # Reference greedy in NumPy.
        tokens, previous = [], START
        for step in range(limits[row]):
            log_probs = log_softmax(tables[row, step, previous])
            log_probs[[PAD, START]] = -np.inf
            previous = int(np.argmax(log_probs))
            tokens.append(previous)
            if previous == END:
                break
        length = greedy["lengths"][row, 0]
        assert tokens_of(greedy["token_ids"][row, 0], length) == tuple(tokens)
        np.testing.assert_allclose(
            greedy["log_probs"][row, 0],
            toy_log_prob(tables[row], tokens),
            rtol=1e-5,
            atol=1e-6,
        )
    # Beam size 1 is greedy search, token for token, whatever alpha.
    np.testing.assert_array_equal(beam["token_ids"], greedy["token_ids"])
    np.testing.assert_array_equal(beam["lengths"], greedy["lengths"])
    np.testing.assert_allclose(
        beam["log_probs"], greedy["log_probs"], rtol=1e-6
    )


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_larger_alpha_never_gives_shorter_exact_optimum(seed):
    # Documented direction: raising alpha favours longer hypotheses. For
    # the exact optimum this is a theorem (log-probs are <= 0 and the
    # penalty grows with length); checked on a wide, hence exact, beam.
    tables = random_tables(seed, 3, 4, 5, scale=1.0)
    # Make the end token likely early so that alpha matters.
    tables[:, :, :, END] += 1.0
    limits = np.full((3,), 4, "int32")
    # n=3: the program of the exhaustive test; the optimum is rank 0.
    short = run_search(tables, limits, "beam", alpha=0.0, beam_size=12, n=3)
    long = run_search(tables, limits, "beam", alpha=1.5, beam_size=12, n=3)
    assert (long["lengths"][:, 0] >= short["lengths"][:, 0]).all()


def test_alpha_lengthens_beam_search_outputs():
    # Peaked toy models where ending early is often the most likely
    # hypothesis: raising alpha never shortens, and here lengthens, them.
    # Two batches of the (4, 6, 9) shape of the other tests.
    tables = random_tables(0, 8, 6, 9, scale=3.0)
    limits = np.full((4,), 6, "int32")
    lengths = {
        alpha: np.concatenate(
            [
                run_search(
                    tables[half : half + 4],
                    limits,
                    "beam",
                    alpha=alpha,
                    beam_size=3,
                    n=2,
                )["lengths"][:, 0]
                for half in (0, 4)
            ]
        )
        for alpha in (0.0, 0.6, 2.0)
    }
    assert (lengths[0.6] >= lengths[0.0]).all()
    assert (lengths[2.0] >= lengths[0.6]).all()
    assert lengths[2.0].mean() > lengths[0.0].mean()


def test_rows_are_independent_of_the_batch():
    # Stopped rows are frozen: a row's result does not depend on how long
    # the other rows of its batch keep searching.
    tables = random_tables(3, 4, 6, 9)
    limits = np.array([6, 2, 6, 4], "int32")
    together = run_search(tables, limits, "beam", alpha=0.6, beam_size=3, n=2)
    for row in range(4):
        alone = run_search(
            np.repeat(tables[row : row + 1], 4, axis=0),
            np.repeat(limits[row : row + 1], 4),
            "beam",
            alpha=0.6,
            beam_size=3,
            n=2,
        )
        np.testing.assert_array_equal(
            alone["token_ids"][0], together["token_ids"][row]
        )
        np.testing.assert_allclose(
            alone["scores"][0], together["scores"][row], rtol=1e-6
        )


def test_sampling_filters():
    logits = ops.convert_to_tensor(
        np.log(np.array([[0.5, 0.3, 0.15, 0.05]], "float32"))
    )
    top_k = ops.convert_to_numpy(search._filter_logits(logits, 1.0, 2, None))
    assert np.isfinite(top_k[0, :2]).all() and np.isinf(top_k[0, 2:]).all()
    top_p = ops.convert_to_numpy(search._filter_logits(logits, 1.0, 0, 0.7))
    # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: the two most likely tokens remain.
    assert np.isfinite(top_p[0, :2]).all() and np.isinf(top_p[0, 2:]).all()
    # Inverse-CDF sampling picks the token whose CDF interval holds u.
    probs = np.array([[0.5, 0.3, 0.15, 0.05]] * 4, "float32")
    uniform = ops.convert_to_tensor(np.array([0.1, 0.6, 0.85, 0.99], "float32"))
    tokens = search._sample_tokens(
        ops.convert_to_tensor(np.log(probs)), uniform
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(tokens), [0, 1, 2, 3])


def test_length_penalty_values():
    np.testing.assert_allclose(
        ops.convert_to_numpy(search.length_penalty(np.array([1, 7]), 0.6)),
        [1.0, 2.0**0.6],
        rtol=1e-6,
    )
    assert float(ops.convert_to_numpy(search.length_penalty(9, 0.0))) == 1.0


def test_bad_arguments():
    banned = search.banned_logits(5, (PAD, START))
    common = dict(
        step_fn=_toy_step,
        cache={},
        constants={},
        batch_size=1,
        beam_size=4,
        max_length=3,
        row_max_lengths=np.array([3], "int32"),
        start_id=START,
        end_id=END,
        pad_id=PAD,
        banned=banned,
    )
    with pytest.raises(ValueError, match="length_penalty=-0.5"):
        search.beam_search(alpha=-0.5, **common)
    for style in ("gnmt", "hf"):
        with pytest.raises(ValueError, match="length_penalty=nan must be"):
            search.beam_search(
                alpha=float("nan"), length_penalty_style=style, **common
            )
    with pytest.raises(ValueError, match="num_return_sequences=5"):
        search.beam_search(num_return_sequences=5, **common)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 3),
    beam_size=st.integers(1, 4),
    vocabulary_size=st.sampled_from([4, 5, 12]),
    width=st.sampled_from([1, 2]),
    force_end=st.booleans(),
    renormalize=st.booleans(),
)
def test_a_steps_extensions_are_the_best_of_all_beams_and_tokens(
    seed, batch, beam_size, vocabulary_size, width, force_end, renormalize
):
    """A beam search step takes each row's best tokens first
    (`_top_log_probs`), then the best ``width * beam`` extensions among
    them (`_expand`): the same extensions, with the same log-probabilities,
    as the best of all ``beam * V`` one-token extensions of the alive
    hypotheses scored by the full log-softmax with banned tokens, the
    forced end token and renormalization (in NumPy below)."""
    rng = np.random.default_rng(seed)
    rows = batch * beam_size
    logits = (3 * rng.normal(size=(rows, vocabulary_size))).astype("float32")
    alive = (rng.normal(size=(batch, beam_size)) - 5).astype("float32")
    limits = rng.integers(1, 4, size=batch).astype("int32")
    flat_limits = np.repeat(limits, beam_size)
    index = ops.convert_to_tensor(1, "int32")
    k = width * beam_size
    banned = search.banned_logits(vocabulary_size, (PAD, START))
    top = search._top_log_probs(
        ops.convert_to_tensor(logits),
        banned,
        k,
        index,
        ops.convert_to_tensor(flat_limits),
        END,
        force_end,
        renormalize,
    )
    state = search.BeamState(
        alive_sequences=ops.zeros((batch, beam_size, 4), "int32"),
        alive_log_probs=ops.convert_to_tensor(alive),
        cache={},
        finished=None,
        done=None,
        stop=None,
    )
    got = search._expand(
        state, top, k, index, ops.convert_to_tensor(limits), END
    )

    expected = log_softmax(logits) + ops.convert_to_numpy(banned)
    if force_end:
        forced = np.full(vocabulary_size, -np.inf, "float32")
        forced[END] = 0.0
        expected[2 >= flat_limits] = forced
    if renormalize:
        expected = log_softmax(expected)
    candidates = (
        alive[:, :, None] + expected.reshape(batch, beam_size, -1)
    ).reshape(batch, -1)
    order = np.argsort(-candidates, axis=1, kind="stable")[:, :k]
    best = np.take_along_axis(candidates, order, axis=1)
    got_log_probs = ops.convert_to_numpy(got.log_probs)
    finite = np.isfinite(best)
    np.testing.assert_array_equal(np.isfinite(got_log_probs), finite)
    np.testing.assert_allclose(got_log_probs[finite], best[finite], atol=1e-5)
    tokens = ops.convert_to_numpy(got.tokens)
    beams = ops.convert_to_numpy(got.source_beams)
    np.testing.assert_array_equal(
        tokens[finite], (order % vocabulary_size)[finite]
    )
    np.testing.assert_array_equal(
        beams[finite], (order // vocabulary_size)[finite]
    )
