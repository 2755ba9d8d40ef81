"""Greedy search, sampling and beam search over fixed-shape state.

The algorithms here know nothing about the Transformer: they drive a
``step_fn`` that returns next-token logits, so that the same code runs the
cached decoder, a full re-run of the model (the reference the cache is
tested against) and the toy Markov models of the unit tests. Everything is
written with `keras.ops` on tensors whose shapes never change inside the
loop, so the loop compiles under `jax.jit` and `tf.function` (see
`compile.py`) and runs as a plain loop on torch.

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

Conventions shared by all three searches:

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
  penalty of Hugging Face ``transformers`` (see `hf_beam_search`).
"""

import keras
import numpy as np
from keras import ops

NEG_INF = float("-inf")
LENGTH_PENALTY_STYLES = ("gnmt", "hf")
EARLY_STOPPING = (False, True, "never")
# Hugging Face's beam search marks excluded candidates by adding this
# (not -inf); mirrored so that its ties and orderings are reproduced.
_HF_LARGE = 1.0e9


def length_penalty(length, alpha, style="gnmt"):
    """The length penalty a hypothesis's log-probability is divided by.

    Args:
        length: ``|Y|``, a number or a tensor, counting the end token.
        alpha: 0 disables the penalty; the paper uses 0.6 (section 6.1).
        style: ``"gnmt"``, ``((5 + length) / 6) ** alpha`` (Wu et al.,
            2016), or ``"hf"``, ``length ** alpha`` (Hugging Face
            ``transformers``, whose default alpha is 1).
    """
    if style not in LENGTH_PENALTY_STYLES:
        raise ValueError(
            f"length_penalty_style={style!r} is not one of "
            f"{LENGTH_PENALTY_STYLES}."
        )
    length = ops.cast(length, "float32")
    if style == "hf":
        return ops.power(length, ops.cast(alpha, "float32"))
    return ops.power((5.0 + length) / 6.0, ops.cast(alpha, "float32"))


def _process_log_probs(
    logits, banned, index, row_max_lengths, end_id, force_end, renormalize
):
    """Log-probabilities after the token rules of Hugging Face's
    processors: banned tokens get -inf; with ``force_end`` a row's last
    allowed step may only emit the end token (log-probability 0); with
    ``renormalize`` the result is log-softmaxed again."""
    log_probs = _log_softmax(logits, banned)
    if force_end:
        vocabulary_size = log_probs.shape[-1]
        is_end = ops.arange(vocabulary_size, dtype="int32") == end_id
        forced = ops.where(is_end, 0.0, NEG_INF)[None, :]
        last = (index + 1 >= row_max_lengths)[:, None]
        log_probs = ops.where(last, forced, log_probs)
    if renormalize:
        log_probs = ops.log_softmax(log_probs, axis=-1)
    return log_probs


def _log_softmax(logits, banned):
    """Log-probabilities of the full softmax; banned tokens get -inf."""
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    return log_probs + banned


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
        A dict with ``"token_ids"`` ``(batch, 1, max_length)`` (padding
        after the end), ``"lengths"``, ``"log_probs"`` and ``"scores"``,
        each ``(batch, 1)``.
    """
    sequences = ops.concatenate(
        [
            ops.full((batch_size, 1), start_id, "int32"),
            ops.full((batch_size, max_length), pad_id, "int32"),
        ],
        axis=1,
    )
    row_max_lengths = ops.cast(row_max_lengths, "int32")
    log_probs = ops.zeros((batch_size,), "float32")
    lengths = ops.zeros((batch_size,), "int32")
    finished = ops.zeros((batch_size,), "bool")

    def cond(index, sequences, cache, log_probs, lengths, finished):
        return ops.logical_not(ops.all(finished))

    def body(index, sequences, cache, log_probs, lengths, finished):
        logits, cache = step_fn(sequences, index, cache, constants)
        if force_end or renormalize:
            step_log_probs = _process_log_probs(
                logits,
                banned,
                index,
                row_max_lengths,
                end_id,
                force_end,
                renormalize,
            )
        else:
            step_log_probs = _log_softmax(logits, banned)
        if uniform is None:
            token = ops.cast(ops.argmax(step_log_probs, axis=-1), "int32")
        else:
            allowed = step_log_probs if force_end else logits + banned
            filtered = _filter_logits(allowed, temperature, top_k, top_p)
            row_uniform = ops.take(uniform, index, axis=0)
            token = _sample_tokens(filtered, row_uniform)
        token_log_prob = ops.take_along_axis(
            step_log_probs, token[:, None], axis=1
        )[:, 0]
        token = ops.where(finished, pad_id, token)
        log_probs = ops.where(finished, log_probs, log_probs + token_log_prob)
        lengths = ops.where(finished, lengths, index + 1)
        finished = ops.logical_or(
            finished,
            ops.logical_or(token == end_id, index + 1 >= row_max_lengths),
        )
        sequences = _write_column(sequences, index + 1, token)
        return index + 1, sequences, cache, log_probs, lengths, finished

    index = ops.convert_to_tensor(0, "int32")
    _, sequences, _, log_probs, lengths, _ = ops.while_loop(
        cond,
        body,
        (index, sequences, cache, log_probs, lengths, finished),
        maximum_iterations=max_length,
    )
    scores = log_probs / length_penalty(lengths, alpha, length_penalty_style)
    return {
        "token_ids": sequences[:, None, 1:],
        "lengths": lengths[:, None],
        "log_probs": log_probs[:, None],
        "scores": scores[:, None],
    }


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


def _initial_sequences(batch_size, beam_size, max_length, start_id, pad_id):
    """``(batch, beam, max_length + 1)``: the start token, then padding."""
    return ops.concatenate(
        [
            ops.full((batch_size, beam_size, 1), start_id, "int32"),
            ops.full((batch_size, beam_size, max_length), pad_id, "int32"),
        ],
        axis=2,
    )


def _expand(state, step_log_probs, k, index, row_max_lengths, end_id):
    """The ``k`` best one-token extensions of the alive hypotheses.

    Returns a dict: their ``log_probs`` ``(batch, k)``, ``source_beams``
    and ``tokens``, the extended ``sequences`` ``(batch, k, L + 1)``, the
    new ``length`` and ``ended`` (end token, or the row's maximum length).
    """
    batch_size, beam_size = state["alive_log_probs"].shape
    vocabulary_size = step_log_probs.shape[-1]
    # (batch, beam * V): every extension of every alive hypothesis.
    candidates = ops.reshape(
        state["alive_log_probs"][:, :, None]
        + ops.reshape(step_log_probs, (batch_size, beam_size, -1)),
        (batch_size, -1),
    )
    log_probs, indices = ops.top_k(candidates, k)
    indices = ops.cast(indices, "int32")
    source_beams = indices // vocabulary_size
    tokens = indices % vocabulary_size
    sequences = _gather_beams(state["alive_sequences"], source_beams)
    length = index + 1
    at_limit = (length >= row_max_lengths)[:, None]
    return {
        "log_probs": log_probs,
        "source_beams": source_beams,
        "tokens": tokens,
        "sequences": _write_column(sequences, length, tokens),
        "length": length,
        "ended": ops.logical_or(tokens == end_id, at_limit),
    }


def _select_alive(expanded, alive_candidates, beam_size, cache):
    """Keeps the ``beam_size`` best of ``alive_candidates`` (the
    extensions' log-probabilities with the ended ones pushed down) and
    reorders the cache rows to follow their parents.

    Returns ``(log_probs, sequences, cache)`` of the new alive set.
    """
    log_probs, indices = ops.top_k(alive_candidates, beam_size)
    indices = ops.cast(indices, "int32")
    sequences = _gather_beams(expanded["sequences"], indices)
    parents = ops.take_along_axis(expanded["source_beams"], indices, axis=1)
    batch_size = parents.shape[0]
    offsets = ops.arange(batch_size, dtype="int32")[:, None] * beam_size
    parents = ops.reshape(parents + offsets, (batch_size * beam_size,))
    cache = keras.tree.map_structure(
        lambda value: ops.take(value, parents, axis=0), cache
    )
    return log_probs, sequences, cache


def _merge_finished(state, expanded, candidate_scores, extra=None):
    """Keeps the best of the finished set and the candidates by score (a
    candidate that must not enter has a score of -inf or very low).
    ``extra`` maps further per-hypothesis state keys to the candidates'
    values. Returns the new finished state, a dict."""
    beam_size = state["finished_scores"].shape[1]
    merged_scores = ops.concatenate(
        [state["finished_scores"], candidate_scores], axis=1
    )
    new_scores, kept = ops.top_k(merged_scores, beam_size)
    kept = ops.cast(kept, "int32")
    candidates = {
        "finished_sequences": expanded["sequences"],
        "finished_log_probs": expanded["log_probs"],
        "finished_lengths": ops.broadcast_to(
            expanded["length"], ops.shape(expanded["tokens"])
        ),
        **(extra or {}),
    }
    new_state = {
        key: _gather_beams(ops.concatenate([state[key], value], axis=1), kept)
        for key, value in candidates.items()
    }
    new_state["finished_scores"] = new_scores
    return new_state


def _search_outputs(state, n):
    return {
        "token_ids": state["finished_sequences"][:, :n, 1:],
        "lengths": state["finished_lengths"][:, :n],
        "log_probs": state["finished_log_probs"][:, :n],
        "scores": state["finished_scores"][:, :n],
    }


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
    """Beam search with a finished set and the GNMT length penalty.

    The paper decodes with beam size 4 and alpha 0.6 (Vaswani et al.,
    2017, section 6.1). Each step extends every alive hypothesis by every
    token and keeps the ``beam_size`` best extensions by log-probability.
    Those that end with the end token (or reach the row's maximum length)
    leave the beam for the *finished* set, where they compete by
    length-normalized score for ``beam_size`` places and are never
    extended again; the others stay alive (the beam refills to
    ``beam_size`` at the next step). With ``beam_size=1`` this is exactly
    greedy search.

    A row stops when its ``num_return_sequences``-th best finished score
    is at least the best score any alive hypothesis could still reach:
    with ``alpha >= 0`` log-probabilities only fall as a hypothesis grows,
    so that bound is the best alive log-probability divided by the penalty
    at the row's maximum length. A row also stops when no hypothesis is
    left alive. A stopped row is frozen, so its result does not depend on
    the other rows of the batch.

    ``step_fn`` sees ``batch_size * beam_size`` rows, the beams of one
    source next to each other; ``cache`` and ``constants`` must already be
    repeated ``beam_size`` times along their first axis.

    Args:
        step_fn, cache, constants: see the module docstring.
        batch_size, beam_size, max_length: Python ints.
        row_max_lengths: ``(batch_size,)`` int32 limits, at most
            ``max_length``.
        start_id, end_id, pad_id: special token ids.
        banned: ``(V,)`` float32, -inf for tokens never generated.
        alpha: length penalty exponent, ``>= 0`` (a number or a scalar
            tensor).
        num_return_sequences: n, at most ``beam_size``; a Python int, or
            a scalar int32 tensor, in which case all ``beam_size``
            hypotheses are returned and the caller keeps the first n.
        length_penalty_style: ``"gnmt"`` (this search) or ``"hf"``, which
            runs `hf_beam_search` instead, with ``early_stopping``.
        force_end, renormalize: see `greedy_search`.

    Returns:
        A dict with ``"token_ids"`` ``(batch, n, max_length)``,
        ``"lengths"``, ``"log_probs"`` and ``"scores"`` ``(batch, n)``,
        best first (finished hypotheses; unused places score -inf).
    """
    if length_penalty_style not in LENGTH_PENALTY_STYLES:
        raise ValueError(
            f"length_penalty_style={length_penalty_style!r} is not one of "
            f"{LENGTH_PENALTY_STYLES}."
        )
    if length_penalty_style == "hf":
        return hf_beam_search(
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
            alpha=alpha,
            num_return_sequences=num_return_sequences,
            early_stopping=early_stopping,
            force_end=force_end,
            renormalize=renormalize,
        )
    if isinstance(alpha, (int, float)) and alpha < 0:
        raise ValueError(
            f"length_penalty={alpha} must be >= 0: the stopping rule relies "
            "on longer hypotheses never being favoured by less."
        )
    static_n = isinstance(num_return_sequences, int)
    if static_n and not 1 <= num_return_sequences <= beam_size:
        raise ValueError(
            f"num_return_sequences={num_return_sequences} must be between 1 "
            f"and beam_size={beam_size}."
        )
    rows = batch_size * beam_size
    sequences = _initial_sequences(
        batch_size, beam_size, max_length, start_id, pad_id
    )
    row_max_lengths = ops.cast(row_max_lengths, "int32")
    # Only the first beam starts alive, so that the first step does not
    # pick the same token beam_size times.
    first = ops.convert_to_tensor([0.0] + [NEG_INF] * (beam_size - 1))
    alive_log_probs = ops.tile(first[None, :], (batch_size, 1))
    finished_sequences = sequences
    finished_scores = ops.full((batch_size, beam_size), NEG_INF, "float32")
    finished_log_probs = ops.full((batch_size, beam_size), NEG_INF, "float32")
    finished_lengths = ops.zeros((batch_size, beam_size), "int32")
    done = ops.zeros((batch_size,), "bool")
    # The best normalized score an alive hypothesis can still reach.
    best_penalty = length_penalty(row_max_lengths, alpha)

    def cond(index, state):
        return ops.logical_not(ops.all(state["done"]))

    def body(index, state):
        flat = ops.reshape(state["alive_sequences"], (rows, max_length + 1))
        logits, cache = step_fn(flat, index, state["cache"], constants)
        if force_end or renormalize:
            step_log_probs = _process_log_probs(
                logits,
                banned,
                index,
                ops.repeat(row_max_lengths, beam_size, axis=0),
                end_id,
                force_end,
                renormalize,
            )
        else:
            step_log_probs = _log_softmax(logits, banned)
        expanded = _expand(
            state, step_log_probs, beam_size, index, row_max_lengths, end_id
        )
        top_log_probs, is_finished = expanded["log_probs"], expanded["ended"]

        # Alive set: the kept extensions that did not finish, best first.
        alive_log_probs, alive_sequences, cache = _select_alive(
            expanded,
            ops.where(is_finished, NEG_INF, top_log_probs),
            beam_size,
            cache,
        )

        # Finished set: merge the finished extensions by normalized score.
        candidate_scores = ops.where(
            is_finished,
            top_log_probs / length_penalty(expanded["length"], alpha),
            NEG_INF,
        )
        new_state = _merge_finished(state, expanded, candidate_scores)
        # Frozen rows keep their finished set as it was when they stopped.
        done = state["done"]
        for key, value in new_state.items():
            mask = _trailing_axes(done, len(value.shape))
            new_state[key] = ops.where(mask, state[key], value)

        bound = alive_log_probs[:, 0] / best_penalty
        if static_n:
            nth_best = new_state["finished_scores"][:, num_return_sequences - 1]
        else:
            nth_best = ops.take(
                new_state["finished_scores"], num_return_sequences - 1, axis=1
            )
        new_state["done"] = ops.logical_or(
            done,
            ops.logical_or(nth_best >= bound, alive_log_probs[:, 0] == NEG_INF),
        )
        new_state["alive_sequences"] = alive_sequences
        new_state["alive_log_probs"] = alive_log_probs
        new_state["cache"] = cache
        return index + 1, new_state

    state = {
        "alive_sequences": sequences,
        "alive_log_probs": alive_log_probs,
        "cache": dict(cache),
        "finished_sequences": finished_sequences,
        "finished_scores": finished_scores,
        "finished_log_probs": finished_log_probs,
        "finished_lengths": finished_lengths,
        "done": done,
    }
    index = ops.convert_to_tensor(0, "int32")
    _, state = ops.while_loop(
        cond, body, (index, state), maximum_iterations=max_length
    )
    n = num_return_sequences if static_n else beam_size
    return _search_outputs(state, n)


def hf_beam_search(
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
    alpha=1.0,
    num_return_sequences=1,
    early_stopping=False,
    force_end=False,
    renormalize=False,
):
    """Beam search with the rules of Hugging Face ``transformers``.

    The search of ``GenerationMixin.generate(num_beams=k)``, reproduced
    step for step so that a converted model (e.g. an OPUS-MT checkpoint,
    see `keras_transformer.marian`) gives the same outputs:

    - each step keeps the ``2 k`` best extensions; the ``k`` best of them
      that did not finish stay alive, so the beam never shrinks;
    - an extension that ends (end token, or the row's maximum length)
      enters the finished set only if it is among the ``k`` best of the
      ``2 k``, scored ``log_probs / |Y| ** alpha``;
    - a row stops (is frozen) when its finished set is full and the best
      alive hypothesis, divided by the penalty at its current length
      (``early_stopping=False``) or at the maximum length
      (``"never"`` with ``alpha > 0``), would not beat the worst finished
      one; with ``early_stopping=True`` as soon as the set is full;
    - the whole batch stops when every kept extension of every row ended.

    Arguments and returns are those of `beam_search`; ``alpha`` may be
    any number (negative favours shorter outputs).
    """
    if early_stopping not in EARLY_STOPPING:
        raise ValueError(
            f"early_stopping={early_stopping!r} is not one of {EARLY_STOPPING}."
        )
    static_n = isinstance(num_return_sequences, int)
    if static_n and not 1 <= num_return_sequences <= beam_size:
        raise ValueError(
            f"num_return_sequences={num_return_sequences} must be between 1 "
            f"and beam_size={beam_size}."
        )
    rows = batch_size * beam_size
    keep = 2 * beam_size
    top_mask = ops.convert_to_tensor([True] * beam_size + [False] * beam_size)[
        None, :
    ]
    alpha = ops.cast(alpha, "float32")
    row_max_lengths = ops.cast(row_max_lengths, "int32")
    flat_max_lengths = ops.repeat(row_max_lengths, beam_size, axis=0)
    sequences = _initial_sequences(
        batch_size, beam_size, max_length, start_id, pad_id
    )
    first = ops.convert_to_tensor([0.0] + [-_HF_LARGE] * (beam_size - 1))
    if early_stopping == "never":
        best_lengths = ops.cast(row_max_lengths, "float32")
    else:
        best_lengths = None

    def cond(index, state):
        return ops.logical_not(state["stop"])

    def body(index, state):
        flat = ops.reshape(state["alive_sequences"], (rows, max_length + 1))
        logits, cache = step_fn(flat, index, state["cache"], constants)
        step_log_probs = _process_log_probs(
            logits,
            banned,
            index,
            flat_max_lengths,
            end_id,
            force_end,
            renormalize,
        )
        expanded = _expand(
            state, step_log_probs, keep, index, row_max_lengths, end_id
        )
        top_log_probs, ended = expanded["log_probs"], expanded["ended"]
        length = expanded["length"]

        # Alive: the beam_size best extensions that did not end.
        alive_log_probs, alive_sequences, cache = _select_alive(
            expanded,
            top_log_probs - ops.cast(ended, "float32") * _HF_LARGE,
            beam_size,
            cache,
        )

        # Finished: the ended extensions among the beam_size best.
        just_finished = ops.logical_and(ended, top_mask)
        penalty = length_penalty(length, alpha, "hf")
        candidate_scores = top_log_probs / penalty
        if early_stopping is True:
            full = ops.all(state["is_finished"], axis=1, keepdims=True)
            candidate_scores -= ops.cast(full, "float32") * _HF_LARGE
        candidate_scores -= (
            ops.cast(ops.logical_not(state["improvable"]), "float32")[:, None]
            * _HF_LARGE
        )
        candidate_scores -= (
            ops.cast(ops.logical_not(just_finished), "float32") * _HF_LARGE
        )
        new_state = _merge_finished(
            state,
            expanded,
            candidate_scores,
            extra={"is_finished": just_finished},
        )
        new_scores = new_state["finished_scores"]

        # Can an alive hypothesis still beat the worst finished one?
        lengths = ops.cast(length, "float32")
        if best_lengths is not None:
            lengths = ops.where(alpha > 0, best_lengths, lengths)
        best_alive = alive_log_probs[:, 0] / ops.power(lengths, alpha)
        worst = ops.min(new_scores, axis=1, keepdims=True)
        worst = ops.where(new_state["is_finished"], worst, -_HF_LARGE)
        improvable = ops.logical_and(
            state["improvable"], ops.any(best_alive[:, None] > worst, axis=1)
        )
        done = ops.logical_not(improvable)
        if early_stopping is True:
            done = ops.logical_or(
                done, ops.all(new_state["is_finished"], axis=1)
            )
        new_state["stop"] = ops.logical_or(ops.all(done), ops.all(ended))
        new_state["improvable"] = improvable
        new_state["alive_sequences"] = alive_sequences
        new_state["alive_log_probs"] = alive_log_probs
        new_state["cache"] = cache
        return index + 1, new_state

    state = {
        "alive_sequences": sequences,
        "alive_log_probs": ops.tile(first[None, :], (batch_size, 1)),
        "cache": dict(cache),
        "finished_sequences": sequences,
        "finished_scores": ops.full(
            (batch_size, beam_size), -_HF_LARGE, "float32"
        ),
        "finished_log_probs": ops.full(
            (batch_size, beam_size), NEG_INF, "float32"
        ),
        "finished_lengths": ops.zeros((batch_size, beam_size), "int32"),
        "is_finished": ops.zeros((batch_size, beam_size), "bool"),
        "improvable": ops.ones((batch_size,), "bool"),
        "stop": ops.convert_to_tensor(False),
    }
    index = ops.convert_to_tensor(0, "int32")
    _, state = ops.while_loop(
        cond, body, (index, state), maximum_iterations=max_length
    )
    n = num_return_sequences if static_n else beam_size
    return _search_outputs(state, n)


def banned_logits(vocabulary_size, banned_ids):
    """``(V,)`` float32: 0 for tokens the search may emit, -inf for
    ``banned_ids``."""
    banned = np.zeros((vocabulary_size,), "float32")
    for token in banned_ids:
        if token is not None and 0 <= token < vocabulary_size:
            banned[token] = NEG_INF
    return ops.convert_to_tensor(banned)
