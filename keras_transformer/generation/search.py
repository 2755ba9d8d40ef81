"""Greedy search, sampling and beam search over fixed-shape state.

The algorithms here know nothing about the Transformer: they drive a
``step_fn`` that returns next-token logits, so that the same code runs the
cached decoder, a full re-run of the model (the reference the cache is
tested against) and the toy Markov models of the unit tests. Everything is
written with `keras.ops` on tensors whose shapes never change inside the
loop, so the loop compiles under `jax.jit` and `tf.function` (see
`keras_transformer.backends.compile_search`) and runs as a plain loop on
torch. The loop state is a `typing.NamedTuple` (`GreedyState`,
`BeamState`), which every backend's loop carries as a nested structure.

``step_fn(sequences, index, cache, constants) -> (logits, cache)``:

- ``sequences``: ``(rows, max_length + 1)`` int32, the start token in
  column 0 and the token generated at step ``t`` in column ``t + 1``.
- ``index``: scalar int32 tensor ``t``; the step feeds ``sequences[:, t]``
  and returns the logits of the token at column ``t + 1``, ``(rows, V)``.
- ``cache``: a dict of tensors, or of nested tuples of them, whose first
  axis is ``rows``; beam search reorders every one of them along that
  axis when hypotheses are extended. ``step_fn`` may write into the
  cache it is given (torch's eager decoding does), so a cache passed to
  ``step_fn`` is never read again: the searches go on with the cache it
  returns.
- ``constants``: a dict of tensors passed through unchanged.

Conventions shared by all the searches:

- A hypothesis's length ``|Y|`` counts its generated tokens *including*
  the end token; a hypothesis cut at its maximum length has no end token
  and ``|Y|`` equal to that maximum.
- ``log_probs`` is the sum of ``log p(y_t | y_<t, x)`` over those tokens
  under the model's full softmax (a token forbidden by the search, such as
  padding, is removed without renormalizing, so the sum is exactly the
  model's own score of the hypothesis).
- ``scores`` are ``log_probs / length_penalty(|Y|, alpha)`` with the GNMT
  penalty ``((5 + |Y|) / 6) ** alpha`` (Wu et al., 2016, section 7), or,
  with ``length_penalty_style="hf"``, ``log_probs / |Y| ** alpha``, the
  penalty of Hugging Face ``transformers``.
"""

import math
import numbers
import typing

import keras
import numpy as np
from keras import ops

NEG_INF = float("-inf")
LENGTH_PENALTY_STYLES = ("gnmt", "hf")
EARLY_STOPPING = (False, True, "never")
# Hugging Face's beam search marks excluded candidates by adding this
# (not -inf); mirrored so that its ties and orderings are reproduced.
_HF_LARGE = 1.0e9


def check_choice(name, value, choices):
    """Raises a ValueError naming ``value`` and the ``choices`` when it is
    not one of them."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}.")


def check_num_return_sequences(num_return_sequences, method, beam_size):
    """Raises a ValueError when a search of ``method`` cannot return
    ``num_return_sequences`` hypotheses per source: greedy search returns
    one, beam search at most ``beam_size``, sampling any number."""
    n = num_return_sequences
    if int(n) != n or n < 1:
        raise ValueError(
            f"num_return_sequences={n} must be a positive integer."
        )
    if method == "greedy" and n != 1:
        raise ValueError(
            "Greedy search returns one sequence per source; got "
            f'num_return_sequences={n}. Use method="beam" or '
            'method="sample" for more.'
        )
    if method == "beam" and n > beam_size:
        raise ValueError(
            f"num_return_sequences={n} must be at most beam_size={beam_size}."
        )


# The float settings of a search, and the usual value of those that have
# one, for the message refusing NaN or an infinity.
FINITE_SETTINGS = {
    "length_penalty": "0.6 in the paper; 0 disables it",
    "temperature": "1 leaves the probabilities as they are",
    "top_p": "1 disables the filter",
}


def check_finite(name, value):
    """Raises a ValueError when the setting ``name`` is a NaN or infinite
    number."""
    if isinstance(value, numbers.Real) and not math.isfinite(value):
        raise ValueError(
            f"{name}={value} must be a finite number ({FINITE_SETTINGS[name]})."
        )


def check_length_penalty(alpha, style):
    """Raises a ValueError for an unknown ``style``, or for a negative
    ``alpha`` (a number) with the GNMT penalty: the paper's beam search
    stops on the bound that longer hypotheses never score higher."""
    check_choice("length_penalty_style", style, LENGTH_PENALTY_STYLES)
    check_finite("length_penalty", alpha)
    if style == "gnmt" and isinstance(alpha, numbers.Real) and alpha < 0:
        raise ValueError(
            f"length_penalty={alpha} must be >= 0 (0.6 in the paper; 0 "
            "disables it): the beam search's stopping rule relies on "
            "longer hypotheses never being favoured by less."
        )


def length_penalty(length, alpha, style="gnmt"):
    """The length penalty a hypothesis's log-probability is divided by.

    Args:
        length: ``|Y|``, a number, an array or a tensor, counting the end
            token.
        alpha: 0 disables the penalty; the paper uses 0.6 (section 6.1).
        style: ``"gnmt"``, ``((5 + length) / 6) ** alpha`` (Wu et al.,
            2016), or ``"hf"``, ``length ** alpha`` (Hugging Face
            ``transformers``, whose default alpha is 1).

    Returns:
        A float32 tensor shaped like ``length``.
    """
    check_choice("length_penalty_style", style, LENGTH_PENALTY_STYLES)
    length = ops.cast(length, "float32")
    if style == "hf":
        return ops.power(length, ops.cast(alpha, "float32"))
    return ops.power((5.0 + length) / 6.0, ops.cast(alpha, "float32"))


class Hypotheses(typing.NamedTuple):
    """What a search returns: the hypotheses of each source, best first
    (unused places of a beam search score -inf)."""

    token_ids: typing.Any  # (batch, n, max_length) int32, padding after
    lengths: typing.Any  # (batch, n) int32, |Y| with the end token
    log_probs: typing.Any  # (batch, n) float32, the model's own
    scores: typing.Any  # (batch, n) float32, log_probs / length penalty


# --- one step's token rules


def _process_log_probs(
    logits, banned, index, row_max_lengths, end_id, force_end, renormalize
):
    """Log-probabilities of the full softmax with banned tokens at -inf;
    then the token rules of Hugging Face's processors: with ``force_end``
    a row's last allowed step may only emit the end token
    (log-probability 0); with ``renormalize`` the result is log-softmaxed
    again."""
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    log_probs = log_probs + banned
    if force_end:
        vocabulary_size = log_probs.shape[-1]
        is_end = ops.arange(vocabulary_size, dtype="int32") == end_id
        forced = ops.where(is_end, 0.0, NEG_INF)[None, :]
        last = (index + 1 >= row_max_lengths)[:, None]
        log_probs = ops.where(last, forced, log_probs)
    if renormalize:
        log_probs = ops.log_softmax(log_probs, axis=-1)
    return log_probs


def _top_log_probs(
    logits, banned, k, index, row_max_lengths, end_id, force_end, renormalize
):
    """The ``k`` most probable tokens of each row, ``(log_probs, ids)``,
    ``(rows, k)`` each, best first, with the log-probabilities that
    `_process_log_probs` gives them; only these ``k`` columns are
    forced or renormalized, so a step makes no more vocabulary-sized
    tensors than the log-softmax and its banned tokens. (Of a forced row,
    the first is the end token at 0, the others -inf.)"""
    log_probs = _process_log_probs(
        logits, banned, index, row_max_lengths, end_id, False, False
    )
    k = min(k, log_probs.shape[-1])
    values, ids = ops.top_k(log_probs, k)
    ids = ops.cast(ids, "int32")
    if renormalize:
        # The log-softmax of a row shifts it by its log-sum-exp.
        values = values - ops.logsumexp(log_probs, axis=-1, keepdims=True)
    if force_end:
        last = (index + 1 >= row_max_lengths)[:, None]
        first = (ops.arange(k) == 0)[None, :]
        values = ops.where(last, ops.where(first, 0.0, NEG_INF), values)
        ids = ops.where(last, ops.where(first, end_id, ids), ids)
    return values, ops.cast(ids, "int32")


def _write_column(sequences, index, column):
    """``sequences[..., index] = column`` for a 2-D or 3-D int tensor."""
    column = ops.cast(column, sequences.dtype)
    if len(sequences.shape) == 2:
        return ops.slice_update(sequences, [0, index], column[:, None])
    return ops.slice_update(sequences, [0, 0, index], column[:, :, None])


def _filter_logits(logits, temperature, top_k, top_p):
    """Logits for sampling: tempered, then top-k and nucleus filtered."""
    logits = ops.cast(logits, "float32") / ops.cast(temperature, "float32")
    vocabulary_size = logits.shape[-1]
    if top_k and top_k < vocabulary_size:
        kth = ops.top_k(logits, top_k)[0][:, -1:]
        logits = ops.where(logits < kth, NEG_INF, logits)
    if top_p is not None:
        # Keep the smallest set of most likely tokens whose probability
        # reaches top_p (Holtzman et al., 2020): a token is kept when the
        # mass of the tokens strictly more likely than it is below top_p.
        sorted_logits = ops.top_k(logits, vocabulary_size)[0]
        probs = ops.softmax(sorted_logits, axis=-1)
        mass_before = ops.cumsum(probs, axis=-1) - probs
        top_p = ops.cast(top_p, "float32")
        kept = ops.where(mass_before < top_p, sorted_logits, float("inf"))
        threshold = ops.min(kept, axis=-1, keepdims=True)
        logits = ops.where(logits < threshold, NEG_INF, logits)
    return logits


def _sample_tokens(logits, uniform):
    """Inverse-CDF sampling: one uniform number per row picks a token.

    The uniform numbers are drawn outside the compiled loop, which keeps
    the loop free of random state and the samples identical on every
    backend for one seed.
    """
    probs = ops.softmax(logits, axis=-1)
    cdf = ops.cumsum(probs, axis=-1)
    target = uniform[:, None] * cdf[:, -1:]
    token = ops.sum(ops.cast(cdf < target, "int32"), axis=-1)
    return ops.minimum(token, logits.shape[-1] - 1)


# --- greedy search and sampling


class GreedyState(typing.NamedTuple):
    """The loop state of `greedy_search`."""

    sequences: typing.Any  # (rows, max_length + 1) int32
    cache: typing.Any  # step_fn's cache, leaves (rows, ...)
    log_probs: typing.Any  # (rows,) float32
    lengths: typing.Any  # (rows,) int32
    finished: typing.Any  # (rows,) bool


def greedy_search(
    step_fn,
    cache,
    constants,
    batch_size,
    max_length,
    row_max_lengths,
    start_id,
    end_id,
    pad_id,
    banned,
    alpha=0.0,
    uniform=None,
    temperature=1.0,
    top_k=0,
    top_p=None,
    length_penalty_style="gnmt",
    force_end=False,
    renormalize=False,
):
    """Greedy decoding, or sampling when ``uniform`` is given.

    Args:
        step_fn, cache, constants: see the module docstring.
        batch_size: number of rows (a Python int).
        max_length: the most tokens any row may generate (a Python int).
        row_max_lengths: ``(batch_size,)`` int32, each row's own limit,
            at most ``max_length``.
        start_id, end_id, pad_id: special token ids.
        banned: ``(V,)`` float32, 0 for allowed tokens, -inf for tokens
            never generated (padding, start).
        alpha: length penalty exponent used for the returned scores (a
            number or a scalar tensor).
        uniform: ``(max_length, batch_size)`` uniform numbers in (0, 1)
            to sample with; None for greedy (argmax) decoding.
        temperature, top_k, top_p: sampling filters (top_k 0 and top_p
            None disable them; temperature and top_p may be tensors).
        length_penalty_style: ``"gnmt"`` or ``"hf"`` for the scores.
        force_end: a row's last allowed token is the end token (Hugging
            Face's ``forced_eos_token_id``).
        renormalize: log-softmax again after banning tokens (Hugging
            Face's ``renormalize_logits``); changes the reported
            log-probabilities, not the argmax.

    Returns:
        `Hypotheses` with ``n = 1``.
    """
    row_max_lengths = ops.cast(row_max_lengths, "int32")

    def choose(index, logits, step_log_probs):
        if uniform is None:
            return ops.cast(ops.argmax(step_log_probs, axis=-1), "int32")
        allowed = step_log_probs if force_end else logits + banned
        filtered = _filter_logits(allowed, temperature, top_k, top_p)
        return _sample_tokens(filtered, ops.take(uniform, index, axis=0))

    def cond(index, state):
        return ops.logical_not(ops.all(state.finished))

    def body(index, state):
        logits, cache = step_fn(state.sequences, index, state.cache, constants)
        step_log_probs = _process_log_probs(
            logits,
            banned,
            index,
            row_max_lengths,
            end_id,
            force_end,
            renormalize,
        )
        token = choose(index, logits, step_log_probs)
        token_log_prob = ops.take_along_axis(
            step_log_probs, token[:, None], axis=1
        )[:, 0]
        finished = state.finished
        token = ops.where(finished, pad_id, token)
        ended = ops.logical_or(token == end_id, index + 1 >= row_max_lengths)
        return index + 1, GreedyState(
            sequences=_write_column(state.sequences, index + 1, token),
            cache=cache,
            log_probs=ops.where(
                finished, state.log_probs, state.log_probs + token_log_prob
            ),
            lengths=ops.where(finished, state.lengths, index + 1),
            finished=ops.logical_or(finished, ended),
        )

    state = GreedyState(
        sequences=_initial_sequences(
            (batch_size,), max_length, start_id, pad_id
        ),
        cache=cache,
        log_probs=ops.zeros((batch_size,), "float32"),
        lengths=ops.zeros((batch_size,), "int32"),
        finished=ops.zeros((batch_size,), "bool"),
    )
    index = ops.convert_to_tensor(0, "int32")
    _, state = ops.while_loop(
        cond, body, (index, state), maximum_iterations=max_length
    )
    penalty = length_penalty(state.lengths, alpha, length_penalty_style)
    return Hypotheses(
        token_ids=state.sequences[:, None, 1:],
        lengths=state.lengths[:, None],
        log_probs=state.log_probs[:, None],
        scores=(state.log_probs / penalty)[:, None],
    )


def _initial_sequences(shape, max_length, start_id, pad_id):
    """``shape + (max_length + 1,)``: the start token, then padding."""
    rank = len(shape)
    return ops.concatenate(
        [
            ops.full(shape + (1,), start_id, "int32"),
            ops.full(shape + (max_length,), pad_id, "int32"),
        ],
        axis=rank,
    )


# --- beam search


class Finished(typing.NamedTuple):
    """The finished hypotheses of a beam search, best score first."""

    sequences: typing.Any  # (batch, beam, max_length + 1) int32
    log_probs: typing.Any  # (batch, beam) float32
    lengths: typing.Any  # (batch, beam) int32
    scores: typing.Any  # (batch, beam) float32
    filled: typing.Any  # (batch, beam) bool, the place holds a hypothesis


class BeamState(typing.NamedTuple):
    """The loop state of `beam_search` (after flax's examples/wmt
    ``BeamState``)."""

    alive_sequences: typing.Any  # (batch, beam, max_length + 1) int32
    alive_log_probs: typing.Any  # (batch, beam) float32, best first
    cache: typing.Any  # step_fn's cache, leaves (batch * beam, ...)
    finished: Finished  # the finished set, (batch, beam) places
    done: typing.Any  # (batch,) bool, the row's finished set takes no more
    stop: typing.Any  # () bool, the loop ends


class Extensions(typing.NamedTuple):
    """The ``k`` best one-token extensions of a step, best first."""

    log_probs: typing.Any  # (batch, k) float32
    source_beams: typing.Any  # (batch, k) int32, the hypothesis extended
    tokens: typing.Any  # (batch, k) int32, the token appended
    sequences: typing.Any  # (batch, k, max_length + 1) int32
    length: typing.Any  # () int32, |Y| of every extension
    ended: typing.Any  # (batch, k) bool, end token or the row's limit


def _gather_beams(tensor, indices):
    """``tensor[b, indices[b, j]]`` for a ``(batch, beams, ...)`` tensor."""
    if len(tensor.shape) > 2:
        # take_along_axis needs the index broadcast to the full trailing
        # shape.
        indices = ops.broadcast_to(
            _trailing_axes(indices, len(tensor.shape)),
            tuple(ops.shape(indices)) + tuple(tensor.shape[2:]),
        )
    return ops.take_along_axis(tensor, indices, axis=1)


def _trailing_axes(x, rank):
    """``x`` with axes of size 1 appended up to ``rank``, by indexing
    (cheaper than `ops.reshape` on eager torch)."""
    return x[(...,) + (None,) * (rank - len(x.shape))]


def _expand(state, top, k, index, row_max_lengths, end_id):
    """The ``k`` best one-token extensions of the alive hypotheses, from
    each one's ``top`` tokens (`_top_log_probs`: at least ``k``, or the
    whole vocabulary): the best ``k`` of all extensions are among them."""
    batch_size, beam_size = state.alive_log_probs.shape
    top_log_probs, top_ids = top
    per_beam = top_log_probs.shape[-1]
    # (batch, beam * per_beam): the candidate extensions of every alive
    # hypothesis.
    candidates = ops.reshape(
        state.alive_log_probs[:, :, None]
        + ops.reshape(top_log_probs, (batch_size, beam_size, per_beam)),
        (batch_size, -1),
    )
    log_probs, indices = ops.top_k(candidates, k)
    indices = ops.cast(indices, "int32")
    source_beams = indices // per_beam
    tokens = ops.take_along_axis(
        ops.reshape(top_ids, (batch_size, -1)), indices, axis=1
    )
    sequences = _gather_beams(state.alive_sequences, source_beams)
    length = index + 1
    at_limit = (length >= row_max_lengths)[:, None]
    return Extensions(
        log_probs=log_probs,
        source_beams=source_beams,
        tokens=tokens,
        sequences=_write_column(sequences, length, tokens),
        length=length,
        ended=ops.logical_or(tokens == end_id, at_limit),
    )


def _select_alive(extensions, alive_candidates, beam_size, cache):
    """Keeps the ``beam_size`` best of ``alive_candidates`` (the
    extensions' log-probabilities with the ended ones pushed down) and
    reorders the cache rows to follow their parents.

    Returns ``(log_probs, sequences, cache)`` of the new alive set.
    """
    log_probs, indices = ops.top_k(alive_candidates, beam_size)
    indices = ops.cast(indices, "int32")
    sequences = _gather_beams(extensions.sequences, indices)
    parents = ops.take_along_axis(extensions.source_beams, indices, axis=1)
    batch_size = parents.shape[0]
    offsets = ops.arange(batch_size, dtype="int32")[:, None] * beam_size
    parents = ops.reshape(parents + offsets, (batch_size * beam_size,))
    cache = keras.tree.map_structure(
        lambda value: ops.take(value, parents, axis=0), cache
    )
    return log_probs, sequences, cache


def _merge_finished(finished, extensions, scores, filled):
    """The best of the finished set and the extensions by score (an
    extension that must not enter scores -inf or very low)."""
    beam_size = finished.scores.shape[1]
    merged_scores = ops.concatenate([finished.scores, scores], axis=1)
    new_scores, kept = ops.top_k(merged_scores, beam_size)
    kept = ops.cast(kept, "int32")

    def merge(old, new):
        return _gather_beams(ops.concatenate([old, new], axis=1), kept)

    lengths = ops.broadcast_to(extensions.length, ops.shape(extensions.tokens))
    return Finished(
        sequences=merge(finished.sequences, extensions.sequences),
        log_probs=merge(finished.log_probs, extensions.log_probs),
        lengths=merge(finished.lengths, lengths),
        scores=new_scores,
        filled=merge(finished.filled, filled),
    )


class GnmtRule:
    """The finished set and stopping rule of the paper's beam search
    (Vaswani et al., 2017, section 6.1; Wu et al., 2016, section 7).

    Each step keeps the ``beam_size`` best extensions; those that ended
    enter the finished set, where they compete by score for ``beam_size``
    places; the others stay alive, so the beam may hold fewer live
    hypotheses until the next step refills it. With ``alpha >= 0``
    log-probabilities only fall as a hypothesis grows, so no alive
    hypothesis can score above its log-probability divided by the
    penalty at the row's maximum length: a row is done when its n-th
    best finished score reaches that bound, or when nothing is left
    alive. A done row's finished set is frozen, so its result does not
    depend on the other rows of the batch.
    """

    style = "gnmt"
    width = 1  # extensions kept per beam and step
    excluded = NEG_INF  # the score of a hypothesis that may not compete

    def __init__(self, alpha, row_max_lengths, num_return_sequences):
        check_length_penalty(alpha, self.style)
        self.n = num_return_sequences
        # The best score an alive hypothesis can still reach, per row.
        self.best_penalty = length_penalty(row_max_lengths, alpha)

    @staticmethod
    def exclude(values, mask):
        """``values`` with those under ``mask`` out of the competition."""
        return ops.where(mask, NEG_INF, values)

    def admit(self, state, extensions, scores):
        """The extensions' scores for the finished set, and which fill a
        place: every extension that ended."""
        ended = extensions.ended
        return self.exclude(scores, ops.logical_not(ended)), ended

    def settle(self, state, finished, alive_log_probs, extensions):
        """The finished set (frozen in done rows), ``done`` and ``stop``."""
        finished = keras.tree.map_structure(
            lambda old, new: ops.where(
                _trailing_axes(state.done, len(new.shape)), old, new
            ),
            state.finished,
            finished,
        )
        best_alive = alive_log_probs[:, 0]
        if isinstance(self.n, int):
            nth_best = finished.scores[:, self.n - 1]
        else:
            nth_best = ops.take(finished.scores, self.n - 1, axis=1)
        done = ops.logical_or(
            state.done,
            ops.logical_or(
                nth_best >= best_alive / self.best_penalty,
                best_alive == NEG_INF,
            ),
        )
        return finished, done, ops.all(done)


class HuggingFaceRule:
    """The finished set and stopping rule of Hugging Face
    ``transformers``' ``generate(num_beams=k)``, reproduced step for step
    so that a converted model (an OPUS-MT checkpoint, see
    `keras_transformer.marian`) gives the same outputs:

    - each step keeps the ``2 k`` best extensions; the ``k`` best of them
      that did not end stay alive, so the beam never shrinks;
    - an extension that ended enters the finished set only if it is
      among the ``k`` best of the ``2 k``;
    - a row is done (admits no more hypotheses) when its finished set is
      full and the best alive hypothesis, divided by the penalty at its
      current length (``early_stopping=False``) or at the row's maximum
      length (``"never"`` with ``alpha > 0``), would not beat the worst
      finished one; with ``early_stopping=True`` a full set admits none;
    - the loop stops when every row is done (with ``early_stopping=True``,
      full), or when every kept extension of every row ended.

    ``alpha`` may be any number (negative favours shorter outputs).
    """

    style = "hf"
    width = 2  # extensions kept per beam and step
    excluded = -_HF_LARGE  # the score of a hypothesis that may not compete

    def __init__(self, alpha, row_max_lengths, beam_size, early_stopping):
        check_choice("early_stopping", early_stopping, EARLY_STOPPING)
        check_length_penalty(alpha, self.style)
        self.alpha = ops.cast(alpha, "float32")
        self.early_stopping = early_stopping
        self.best_lengths = (
            row_max_lengths if early_stopping == "never" else None
        )
        # (1, 2 k): the k best of the 2 k extensions.
        self.top = ops.convert_to_tensor(
            [True] * beam_size + [False] * beam_size
        )[None, :]

    @staticmethod
    def exclude(values, mask):
        """``values`` with those under ``mask`` pushed down by a large
        number, as ``transformers`` does (not to -inf: its ties and
        orderings depend on it)."""
        return values - ops.cast(mask, "float32") * _HF_LARGE

    def admit(self, state, extensions, scores):
        """The extensions' scores for the finished set, and which fill a
        place: those that ended among the k best."""
        if self.early_stopping is True:
            full = ops.all(state.finished.filled, axis=1, keepdims=True)
            scores = self.exclude(scores, full)
        scores = self.exclude(scores, state.done[:, None])
        just_finished = ops.logical_and(extensions.ended, self.top)
        scores = self.exclude(scores, ops.logical_not(just_finished))
        return scores, just_finished

    def settle(self, state, finished, alive_log_probs, extensions):
        """The finished set, ``done`` and ``stop``."""
        lengths = extensions.length
        if self.best_lengths is not None:
            lengths = ops.where(
                self.alpha > 0,
                ops.cast(self.best_lengths, "float32"),
                ops.cast(lengths, "float32"),
            )
        best_alive = alive_log_probs[:, 0] / length_penalty(
            lengths, self.alpha, "hf"
        )
        worst = ops.min(finished.scores, axis=1, keepdims=True)
        worst = ops.where(finished.filled, worst, -_HF_LARGE)
        improvable = ops.any(best_alive[:, None] > worst, axis=1)
        done = ops.logical_or(state.done, ops.logical_not(improvable))
        all_done = done
        if self.early_stopping is True:
            all_done = ops.logical_or(done, ops.all(finished.filled, axis=1))
        stop = ops.logical_or(ops.all(all_done), ops.all(extensions.ended))
        return finished, done, stop


def beam_search(
    step_fn,
    cache,
    constants,
    batch_size,
    beam_size,
    max_length,
    row_max_lengths,
    start_id,
    end_id,
    pad_id,
    banned,
    alpha=0.6,
    num_return_sequences=1,
    length_penalty_style="gnmt",
    early_stopping=False,
    force_end=False,
    renormalize=False,
):
    """Beam search with a finished set and a length penalty.

    The paper decodes with beam size 4 and alpha 0.6 (Vaswani et al.,
    2017, section 6.1). Each step extends every alive hypothesis by every
    token and keeps the best extensions by log-probability; those that
    end (end token, or the row's maximum length) leave the beam for the
    *finished* set, where they compete by length-normalized score and are
    never extended again. ``length_penalty_style`` picks the convention:
    how many extensions a step keeps, which of them enter the finished
    set, when a row and the search stop, and the length penalty:

    - ``"gnmt"``: the paper's beam search with the GNMT penalty
      (`GnmtRule`); with ``beam_size=1`` it is exactly greedy search.
    - ``"hf"``: Hugging Face ``transformers``' beam search and penalty
      ``|Y| ** alpha``, with its ``early_stopping`` (`HuggingFaceRule`).

    ``step_fn`` sees ``batch_size * beam_size`` rows, the beams of one
    source next to each other; ``cache`` must already be repeated
    ``beam_size`` times along its first axis (the search reorders its
    rows), and ``constants`` hold what ``step_fn`` reads, as it reads it.

    Args:
        step_fn, cache, constants: see the module docstring.
        batch_size, beam_size, max_length: Python ints.
        row_max_lengths: ``(batch_size,)`` int32 limits, at most
            ``max_length``.
        start_id, end_id, pad_id: special token ids.
        banned: ``(V,)`` float32, -inf for tokens never generated.
        alpha: length penalty exponent (a number or a scalar tensor);
            ``>= 0`` with ``"gnmt"``.
        num_return_sequences: n, at most ``beam_size``; a Python int, or
            a scalar int32 tensor, in which case all ``beam_size``
            hypotheses are returned and the caller keeps the first n.
        length_penalty_style: ``"gnmt"`` or ``"hf"``.
        early_stopping: with ``"hf"``, False, True or ``"never"``.
        force_end, renormalize: see `greedy_search`.

    Returns:
        `Hypotheses`, ``(batch, n, ...)``.
    """
    check_choice(
        "length_penalty_style", length_penalty_style, LENGTH_PENALTY_STYLES
    )
    static_n = isinstance(num_return_sequences, int)
    if static_n:
        check_num_return_sequences(num_return_sequences, "beam", beam_size)
    row_max_lengths = ops.cast(row_max_lengths, "int32")
    if length_penalty_style == "hf":
        rule = HuggingFaceRule(
            alpha, row_max_lengths, beam_size, early_stopping
        )
    else:
        rule = GnmtRule(alpha, row_max_lengths, num_return_sequences)
    flat_max_lengths = ops.repeat(row_max_lengths, beam_size, axis=0)
    rows = batch_size * beam_size

    def cond(index, state):
        return ops.logical_not(state.stop)

    def body(index, state):
        flat = ops.reshape(state.alive_sequences, (rows, max_length + 1))
        logits, cache = step_fn(flat, index, state.cache, constants)
        top = _top_log_probs(
            logits,
            banned,
            rule.width * beam_size,
            index,
            flat_max_lengths,
            end_id,
            force_end,
            renormalize,
        )
        extensions = _expand(
            state,
            top,
            rule.width * beam_size,
            index,
            row_max_lengths,
            end_id,
        )
        # Alive: the best extensions that did not end, best first.
        alive_log_probs, alive_sequences, cache = _select_alive(
            extensions,
            rule.exclude(extensions.log_probs, extensions.ended),
            beam_size,
            cache,
        )
        scores = extensions.log_probs / length_penalty(
            extensions.length, alpha, rule.style
        )
        finished = _merge_finished(
            state.finished, extensions, *rule.admit(state, extensions, scores)
        )
        finished, done, stop = rule.settle(
            state, finished, alive_log_probs, extensions
        )
        return index + 1, BeamState(
            alive_sequences, alive_log_probs, cache, finished, done, stop
        )

    state = _initial_beam_state(
        batch_size, beam_size, max_length, start_id, pad_id, cache, rule
    )
    index = ops.convert_to_tensor(0, "int32")
    _, state = ops.while_loop(
        cond, body, (index, state), maximum_iterations=max_length
    )
    n = num_return_sequences if static_n else beam_size
    return Hypotheses(
        token_ids=state.finished.sequences[:, :n, 1:],
        lengths=state.finished.lengths[:, :n],
        log_probs=state.finished.log_probs[:, :n],
        scores=state.finished.scores[:, :n],
    )


def _initial_beam_state(
    batch_size, beam_size, max_length, start_id, pad_id, cache, rule
):
    shape = (batch_size, beam_size)
    sequences = _initial_sequences(shape, max_length, start_id, pad_id)
    # Only the first beam starts alive, so that the first step does not
    # pick the same token beam_size times.
    first = ops.convert_to_tensor([0.0] + [rule.excluded] * (beam_size - 1))
    return BeamState(
        alive_sequences=sequences,
        alive_log_probs=ops.tile(first[None, :], (batch_size, 1)),
        cache=dict(cache),
        finished=Finished(
            sequences=sequences,
            log_probs=ops.full(shape, NEG_INF, "float32"),
            lengths=ops.zeros(shape, "int32"),
            scores=ops.full(shape, rule.excluded, "float32"),
            filled=ops.zeros(shape, "bool"),
        ),
        done=ops.zeros((batch_size,), "bool"),
        stop=ops.convert_to_tensor(False),
    )


def banned_logits(vocabulary_size, banned_ids):
    """``(V,)`` float32: 0 for tokens the search may emit, -inf for
    ``banned_ids``."""
    banned = np.zeros((vocabulary_size,), "float32")
    for token in banned_ids:
        if token is not None and 0 <= token < vocabulary_size:
            banned[token] = NEG_INF
    return ops.convert_to_tensor(banned)
