"""Runs the searches of `search.py` on a `Transformer`: encoder once,
cached decoder one step at a time, compiled once per bucket of shapes."""

import dataclasses
import functools
import math
import typing

import keras
import numpy as np
from keras import ops

from keras_transformer import backends
from keras_transformer.generation import search
from keras_transformer.utils import check_padding_mask, check_token_ids

METHODS = ("greedy", "beam", "sample")
CACHE_LAYOUTS = ("split", "stacked")

# Source lengths are padded up to one of these (then to multiples of the
# largest), and batches to a power of two, so that a whole test set
# compiles a handful of programs instead of one per shape.
LENGTH_BUCKETS = (8, 16, 32, 64, 128, 256)


def bucket_length(length, max_sequence_length):
    """The padded source length for a batch whose longest row has
    ``length`` tokens."""
    for bucket in LENGTH_BUCKETS:
        if length <= bucket:
            return min(bucket, max_sequence_length)
    largest = LENGTH_BUCKETS[-1]
    return min(math.ceil(length / largest) * largest, max_sequence_length)


def bucket_batch(batch_size):
    """The padded batch size: the next power of two."""
    return 1 << max(0, (int(batch_size) - 1).bit_length())


@dataclasses.dataclass
class SearchResult:
    """The hypotheses of a search, best first, as NumPy arrays.

    Attributes:
        token_ids: ``(batch, n, max_length)`` int32, the generated tokens
            including the end token, padding after it.
        lengths: ``(batch, n)`` int32, ``|Y|``: tokens including the end
            token (a hypothesis cut at its maximum length has none).
        log_probs: ``(batch, n)`` float32, the sum of the model's token
            log-probabilities.
        scores: ``(batch, n)`` float32, ``log_probs`` divided by the
            length penalty: GNMT's ``((5 + |Y|) / 6) ** alpha``, or
            ``|Y| ** alpha`` with ``length_penalty_style="hf"``.
    """

    token_ids: np.ndarray
    lengths: np.ndarray
    log_probs: np.ndarray
    scores: np.ndarray

    def sequences(self, end_id=3):
        """The hypotheses as lists of token ids, end token excluded:
        ``[[row_0_best, row_0_second, ...], ...]``."""
        return [
            [
                _strip(ids, length, end_id)
                for ids, length in zip(row_ids, row_lengths, strict=True)
            ]
            for row_ids, row_lengths in zip(
                self.token_ids, self.lengths, strict=True
            )
        ]


def _strip(ids, length, end_id):
    ids = [int(t) for t in ids[: int(length)]]
    if ids and ids[-1] == end_id:
        ids.pop()
    return ids


@dataclasses.dataclass(frozen=True)
class SearchKey:
    """What a compiled search is specialized on: the settings that change
    shapes or the program. The others are `SearchParams`, arguments of
    the compiled function, so that changing them compiles nothing."""

    method: str  # "greedy", "beam" or "sample"
    use_cache: bool  # the key/value cache, or a full decoder re-run
    batch_size: int  # sources, padded to a bucket (`bucket_batch`)
    max_length: int  # the output buffer's length
    copies: int  # rows per source: the beam size, or samples
    top_k: int  # sampling's top-k filter; 0 is off
    top_p: bool  # sampling's nucleus filter is on
    length_penalty_style: str  # "gnmt" or "hf"
    early_stopping: bool | str  # the "hf" beam search's stopping rule
    force_end: bool  # a source's last allowed token is the end token
    renormalize: bool  # log-softmax again after banning tokens


class SearchParams(typing.NamedTuple):
    """The runtime arguments of a compiled search, scalar tensors."""

    alpha: typing.Any  # () float32, the length penalty's exponent
    num_return_sequences: typing.Any  # () int32, of a beam search
    temperature: typing.Any  # () float32, of sampling
    top_p: typing.Any  # () float32, of sampling


@dataclasses.dataclass
class PaddedBatch:
    """Sources padded to their buckets, and the output buffer's length.

    Filler sources beyond ``num_rows`` are a lone end token with a limit
    of one token: they finish after one step."""

    ids: np.ndarray  # (batch_bucket, source_bucket) int32
    mask: np.ndarray  # (batch_bucket, source_bucket) int32
    row_limits: np.ndarray  # (batch_bucket,) int32, tokens per source
    num_rows: int  # the real sources
    buffer_length: int  # the most tokens any source may generate


def search_copies(method, beam_size, num_return_sequences):
    """Rows searched per source: the beam, one greedy hypothesis, or the
    samples."""
    return {"beam": int(beam_size), "greedy": 1}.get(
        method, int(num_return_sequences)
    )


def search_key(
    method,
    batch_size,
    max_length,
    beam_size=4,
    num_return_sequences=1,
    top_k=0,
    top_p=1.0,
    use_cache=True,
    length_penalty_style="gnmt",
    early_stopping=False,
    force_end_token=False,
    renormalize=False,
):
    """The `SearchKey` of a search of ``batch_size`` padded sources with
    an output buffer of ``max_length`` tokens (see `Generator.generate`
    for the settings)."""
    sampling = method == "sample"
    return SearchKey(
        method=method,
        use_cache=bool(use_cache),
        batch_size=int(batch_size),
        max_length=int(max_length),
        copies=search_copies(method, beam_size, num_return_sequences),
        top_k=int(top_k) if sampling else 0,
        top_p=sampling and top_p < 1.0,
        length_penalty_style=length_penalty_style,
        early_stopping=early_stopping,
        force_end=bool(force_end_token),
        renormalize=bool(renormalize),
    )


def search_params(
    length_penalty=0.6, num_return_sequences=1, temperature=1.0, top_p=1.0
):
    """The `SearchParams` of a search, as scalar tensors."""
    return SearchParams(
        alpha=ops.convert_to_tensor(np.float32(length_penalty)),
        num_return_sequences=ops.convert_to_tensor(
            np.int32(num_return_sequences)
        ),
        temperature=ops.convert_to_tensor(np.float32(temperature)),
        top_p=ops.convert_to_tensor(np.float32(top_p)),
    )


def check_length_settings(max_length, max_length_offset, max_sequence_length):
    """Raises a ValueError for a ``max_length`` outside ``[1,
    max_sequence_length]``, or, without one, a ``max_length_offset``
    below 1."""
    if max_length is None:
        if max_length_offset < 1:
            raise ValueError(
                f"max_length_offset={max_length_offset} must be >= 1."
            )
    elif not 1 <= int(max_length) <= max_sequence_length:
        raise ValueError(
            f"max_length={int(max_length)} must be between 1 and the "
            f"model's max_sequence_length={max_sequence_length}."
        )


def _repeat(x, copies):
    """Each row ``copies`` times, next to each other."""
    return ops.repeat(x, copies, axis=0) if copies > 1 else x


class Generator:
    """Greedy search, beam search and sampling for a `Transformer`.

    The encoder runs once per batch; the decoder runs one token at a time
    with the model's key/value cache (`Transformer.init_cache`), whose
    cross-attention keys and values are computed once. The whole search is
    one compiled function per bucket of shapes
    (`keras_transformer.backends.compile_search`), cached, so repeated
    calls do not recompile.

    Args:
        model: a `keras_transformer.Transformer`.
        start_id, end_id, pad_id: special token ids (the tokenizer's).
        banned_ids: tokens never generated; by default padding and start.
        jit_compile: compile with XLA on TensorFlow.
        cache_layout: ``"split"`` or ``"stacked"`` key/value caches (see
            `Transformer.init_cache`). By default stacked on torch, whose
            eager steps write into it in place (and run each decoder
            layer as one function of torch kernels), and split elsewhere:
            XLA reads and updates split caches in place, while it copies
            slices of stacked ones at every step.

    Example:
    >>> generator = Generator(model)
    >>> result = generator.generate(source_ids, source_mask, beam_size=4)
    >>> result.token_ids.shape  # (batch, 1, max_length)
    """

    def __init__(
        self,
        model,
        start_id=2,
        end_id=3,
        pad_id=0,
        banned_ids=None,
        jit_compile=True,
        cache_layout=None,
    ):
        self.model = model
        self.start_id = int(start_id)
        self.end_id = int(end_id)
        self.pad_id = int(pad_id)
        if banned_ids is None:
            banned_ids = (self.pad_id, self.start_id)
        self.banned_ids = tuple(banned_ids)
        self.jit_compile = jit_compile
        if cache_layout is None:
            cache_layout = backends.default_cache_layout()
        search.check_choice("cache_layout", cache_layout, CACHE_LAYOUTS)
        self.cache_layout = cache_layout
        self.vocabulary_size = (
            model.target_vocabulary_size or model.vocabulary_size
        )
        # SearchKey -> compiled search.
        self._functions = {}

    # --- the compiled search

    @staticmethod
    def _uniform(seed, buffer_length, num_rows, batch_bucket, samples):
        """The uniform numbers a sampling search draws its tokens with,
        ``(buffer_length, batch_bucket * samples)``: drawn for the batch
        bucket of ``num_rows`` sources, so that filler sources added
        beyond it (`backends.search_rows`) do not change a source's draws."""
        drawn = bucket_batch(max(num_rows, 1))
        rng = np.random.default_rng(seed)
        uniform = rng.uniform(1e-6, 1.0, (buffer_length, drawn * samples))
        filler = np.full((buffer_length, (batch_bucket - drawn) * samples), 0.5)
        return np.concatenate([uniform, filler], axis=1).astype("float32")

    @staticmethod
    def _cached_step(decode, sequences, index, cache, constants):
        # (rows, 1): the token at column `index` is the input of this step.
        ids = ops.take(sequences, ops.reshape(index, (1,)), axis=1)
        logits, new_cache = decode(
            ids,
            {
                "self_attention": cache["self_attention"],
                "cross_attention": constants["cross_attention"],
            },
            index,
            constants["encoder_padding_mask"],
        )
        return logits[:, 0, :], {"self_attention": new_cache["self_attention"]}

    def _full_step(self, sequences, index, cache, constants):
        # Decoding without the key/value cache, the reference the cache is
        # tested and timed against: the encoder output is computed once,
        # as every decoder does, and the decoder re-runs over the whole
        # buffer (a fixed shape, so that the loop compiles); causal
        # masking hides the columns not yet generated. Only column
        # `index` is projected onto the vocabulary.
        logits = self.model.decode_without_cache(
            sequences[:, :-1],
            constants["encoder_output"],
            constants["encoder_padding_mask"],
            position=index,
        )
        return logits[:, 0, :], cache

    def _decoder(self, key, source_ids, source_mask):
        """``(step_fn, cache, constants)`` of a search (see `search.py`):
        the sources encoded once, each repeated for its ``key.copies``
        rows (the cross-attention cache of a fast path that encodes, once
        per source: its step shares it among the source's rows)."""
        model = self.model
        if not key.use_cache:
            constants = {
                "encoder_output": _repeat(
                    model.encode(source_ids, source_mask), key.copies
                ),
                "encoder_padding_mask": _repeat(source_mask, key.copies),
            }
            return self._full_step, {}, constants
        # The model's decoder step, or a backend's fast path for it (which
        # may encode the sources too), chosen once per search.
        decode = backends.cached_decoder(model, self.cache_layout)
        stacked = self.cache_layout == "stacked"
        # A fast path that encodes shares each source's cross-attention
        # keys and values among the source's rows, unrepeated.
        cross_copies = 1
        if getattr(decode, "init_cache", None) is not None:
            full_cache = decode.init_cache(
                source_ids, source_mask, key.max_length, stacked
            )
        else:
            cross_copies = key.copies
            encoded = model.encode(source_ids, source_mask)
            full_cache = model.init_cache(
                encoded, key.max_length, stacked=stacked
            )
        rows = key.batch_size * key.copies
        # Zeros of their own for every row (not a repeat, which may be a
        # broadcast view): torch decoding writes into them.
        cache = {
            "self_attention": keras.tree.map_structure(
                lambda zeros: ops.zeros(
                    (rows,) + tuple(zeros.shape[1:]), zeros.dtype
                ),
                full_cache["self_attention"],
            )
        }
        constants = {
            "cross_attention": keras.tree.map_structure(
                lambda x: _repeat(x, cross_copies),
                full_cache["cross_attention"],
            ),
            "encoder_padding_mask": _repeat(source_mask, key.copies),
        }
        step_fn = functools.partial(self._cached_step, decode or model.decode)
        return step_fn, cache, constants

    def _build(self, key):
        """The compiled search for ``key``: ``fn(source_ids, source_mask,
        row_max_lengths, uniform, params) -> search.Hypotheses``."""
        banned = search.banned_logits(self.vocabulary_size, self.banned_ids)

        def run(source_ids, source_mask, row_max_lengths, uniform, params):
            step_fn, cache, constants = self._decoder(
                key, source_ids, source_mask
            )
            common = dict(
                step_fn=step_fn,
                cache=cache,
                constants=constants,
                max_length=key.max_length,
                start_id=self.start_id,
                end_id=self.end_id,
                pad_id=self.pad_id,
                banned=banned,
                alpha=params.alpha,
                length_penalty_style=key.length_penalty_style,
                force_end=key.force_end,
                renormalize=key.renormalize,
            )
            if key.method == "beam":
                return search.beam_search(
                    batch_size=key.batch_size,
                    beam_size=key.copies,
                    row_max_lengths=row_max_lengths,
                    num_return_sequences=params.num_return_sequences,
                    early_stopping=key.early_stopping,
                    **common,
                )
            outputs = search.greedy_search(
                batch_size=key.batch_size * key.copies,
                row_max_lengths=_repeat(row_max_lengths, key.copies),
                uniform=uniform,
                temperature=params.temperature,
                top_k=key.top_k,
                top_p=params.top_p if key.top_p else None,
                **common,
            )
            # (batch * n, 1, ...) -> (batch, n, ...)
            return keras.tree.map_structure(
                lambda value: ops.reshape(
                    value, (key.batch_size, key.copies) + tuple(value.shape[2:])
                ),
                outputs,
            )

        return backends.compile_search(run, self.model, self.jit_compile)

    def search_function(self, key):
        """The compiled search for ``key`` (a `SearchKey`), built on first
        use and cached: ``fn(source_ids, source_mask, row_max_lengths,
        uniform, params) -> search.Hypotheses`` on ``key.batch_size``
        padded sources. `generate` calls it on NumPy batches;
        `keras_transformer.export` traces it into a serving graph."""
        function = self._functions.get(key)
        if function is None:
            function = self._functions[key] = self._build(key)
        return function

    # --- the public entry point

    def generate(
        self,
        encoder_token_ids,
        encoder_padding_mask=None,
        method="beam",
        beam_size=4,
        length_penalty=0.6,
        max_length=None,
        max_length_offset=50,
        num_return_sequences=1,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        seed=None,
        use_cache=True,
        length_penalty_style="gnmt",
        early_stopping=False,
        force_end_token=False,
        renormalize=False,
    ):
        """Decodes a batch of sources.

        Args:
            encoder_token_ids: ``(batch, source_length)`` int array, the
                source tokens followed by the end token, then padding.
            encoder_padding_mask: 1 for real tokens; by default the
                non-padding ids.
            method: ``"beam"``, ``"greedy"`` or ``"sample"``.
            beam_size: hypotheses kept alive per source (4 in the paper).
            length_penalty: alpha of ``((5 + |Y|) / 6) ** alpha`` (0.6 in
                the paper); beam search ranks by it, and every method
                reports scores normalized with it.
            max_length: the most tokens generated per source; by default
                each source's length plus ``max_length_offset`` (the
                paper's "input length + 50"). Always capped at the model's
                ``max_sequence_length``.
            num_return_sequences: hypotheses returned per source: the n
                best of the beam, or n independent samples.
            temperature, top_k, top_p: sampling filters (``top_k=0`` and
                ``top_p=1`` disable them).
            seed: sampling seed; equal seeds give equal samples.
            use_cache: decode with the key/value cache. False runs the
                encoder once and re-runs the decoder over the whole
                output buffer every step: the reference the cache is
                tested and timed against.
            length_penalty_style: ``"gnmt"`` (the paper's beam search) or
                ``"hf"``: Hugging Face ``transformers``' beam search and
                penalty ``|Y| ** alpha`` (`search.HuggingFaceRule`), to
                reproduce the outputs of converted models.
            early_stopping: with ``"hf"``, its stopping rule: False (the
                ``transformers`` default), True or ``"never"``.
            force_end_token: a source's last allowed token is the end
                token (``transformers``' ``forced_eos_token_id``).
            renormalize: log-softmax again after removing banned tokens
                (``transformers``' ``renormalize_logits``).

        Returns:
            A `SearchResult`.
        """
        search.check_choice("method", method, METHODS)
        ids, mask = self._check_sources(encoder_token_ids, encoder_padding_mask)
        beam_size = int(beam_size)
        n = int(num_return_sequences)
        check_settings(
            method,
            beam_size,
            n,
            length_penalty,
            length_penalty_style,
            early_stopping,
            temperature,
            top_k,
            top_p,
        )
        copies = search_copies(method, beam_size, n)
        batch = self._pad(
            ids, mask, copies, use_cache, max_length, max_length_offset
        )
        key = search_key(
            method,
            batch.ids.shape[0],
            batch.buffer_length,
            beam_size=beam_size,
            num_return_sequences=n,
            top_k=top_k,
            top_p=top_p,
            use_cache=use_cache,
            length_penalty_style=length_penalty_style,
            early_stopping=early_stopping,
            force_end_token=force_end_token,
            renormalize=renormalize,
        )
        params = search_params(length_penalty, n, temperature, top_p)
        uniform = None
        if method == "sample":
            uniform = ops.convert_to_tensor(
                self._uniform(
                    seed, key.max_length, batch.num_rows, key.batch_size, n
                )
            )
        outputs = self.search_function(key)(
            ops.convert_to_tensor(batch.ids),
            ops.convert_to_tensor(batch.mask),
            ops.convert_to_tensor(batch.row_limits),
            uniform,
            params,
        )
        token_ids, lengths, log_probs, scores = (
            ops.convert_to_numpy(value)[: batch.num_rows, :n]
            for value in outputs
        )
        return SearchResult(
            token_ids=token_ids.astype("int32"),
            lengths=lengths.astype("int32"),
            log_probs=log_probs.astype("float32"),
            scores=scores.astype("float32"),
        )

    def _check_sources(self, encoder_token_ids, encoder_padding_mask):
        """The sources and their mask as int32 arrays, checked."""
        ids = np.asarray(encoder_token_ids)
        if ids.ndim != 2:
            raise ValueError(
                "encoder_token_ids must have shape (batch, length); got "
                f"shape {ids.shape}."
            )
        check_token_ids(
            "encoder_token_ids",
            ids,
            self.model.vocabulary_size,
            _vocabulary_fix(self.model, "vocabulary_size"),
        )
        ids = ids.astype("int32")
        if encoder_padding_mask is None:
            mask = (ids != self.pad_id).astype("int32")
        else:
            mask = np.asarray(encoder_padding_mask)
            if mask.shape != ids.shape:
                raise ValueError(
                    f"encoder_padding_mask has shape {mask.shape} but "
                    f"encoder_token_ids has shape {ids.shape}."
                )
            check_padding_mask("encoder_padding_mask", mask)
            mask = mask.astype("int32")
        limit = self.model.max_sequence_length
        longest = int(mask.sum(axis=1).max(initial=0))
        if longest > limit:
            raise ValueError(
                f"A source has {longest} tokens, more than the model's "
                f"max_sequence_length={limit}. Truncate the sources."
            )
        return ids, mask

    def _pad(self, ids, mask, copies, use_cache, max_length, max_length_offset):
        """The sources padded to their buckets, so that compilation
        happens rarely, with each source's limit on generated tokens."""
        num_rows = ids.shape[0]
        source_lengths = mask.sum(axis=1)
        limit = self.model.max_sequence_length
        source_bucket = bucket_length(
            max(int(source_lengths.max(initial=0)), 1), limit
        )
        fewest = backends.search_rows(copies, use_cache, self.jit_compile)
        batch_bucket = bucket_batch(max(num_rows, fewest))
        check_length_settings(max_length, max_length_offset, limit)
        if max_length is None:
            buffer_length = min(source_bucket + max_length_offset, limit)
            row_limits = np.minimum(source_lengths + max_length_offset, limit)
        else:
            max_length = int(max_length)
            buffer_length = max_length
            row_limits = np.full((num_rows,), max_length)
        padded_ids = np.full(
            (batch_bucket, source_bucket), self.pad_id, "int32"
        )
        padded_mask = np.zeros((batch_bucket, source_bucket), "int32")
        width = min(ids.shape[1], source_bucket)
        padded_ids[:num_rows, :width] = ids[:, :width]
        padded_mask[:num_rows, :width] = mask[:, :width]
        # Filler rows: a lone end token, finished after one step.
        padded_ids[num_rows:, 0] = self.end_id
        padded_mask[num_rows:, 0] = 1
        padded_limits = np.ones((batch_bucket,), "int32")
        padded_limits[:num_rows] = row_limits
        return PaddedBatch(
            padded_ids, padded_mask, padded_limits, num_rows, buffer_length
        )

    # --- scoring

    def score(
        self,
        encoder_token_ids,
        target_token_ids,
        encoder_padding_mask=None,
        length_penalty=0.6,
        length_penalty_style="gnmt",
    ):
        """The model's own scores of given hypotheses (teacher forcing).

        Args:
            encoder_token_ids: ``(batch, source_length)``.
            target_token_ids: ``(batch, target_length)``, hypotheses as
                `generate` returns them: tokens through the end token, if
                any, then padding.
            encoder_padding_mask: by default the non-padding ids.
            length_penalty: alpha for the normalized scores.
            length_penalty_style: ``"gnmt"`` or ``"hf"``.

        Returns:
            ``(log_probs, lengths, scores)``, NumPy arrays ``(batch,)``.
        """
        ids, mask = self._check_sources(encoder_token_ids, encoder_padding_mask)
        targets = np.asarray(target_token_ids)
        if targets.ndim != 2 or len(targets) != len(ids):
            raise ValueError(
                f"target_token_ids has shape {targets.shape}; it needs one "
                f"row per source: ({len(ids)}, target_length)."
            )
        check_token_ids(
            "target_token_ids",
            targets,
            self.vocabulary_size,
            _vocabulary_fix(
                self.model,
                "target_vocabulary_size"
                if self.model.target_vocabulary_size
                else "vocabulary_size",
            ),
        )
        targets = targets.astype("int32")
        lengths = hypothesis_lengths(targets, self.end_id, self.pad_id)
        decoder_ids = np.concatenate(
            [np.full((len(targets), 1), self.start_id, "int32"), targets],
            axis=1,
        )[:, :-1]
        logits = self.model(
            {
                "encoder_token_ids": ids,
                "encoder_padding_mask": mask,
                "decoder_token_ids": decoder_ids,
                "decoder_padding_mask": np.ones_like(decoder_ids),
            },
            training=False,
        )
        logits = ops.convert_to_numpy(logits).astype("float64")
        log_probs = logits - logits.max(axis=-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(axis=-1, keepdims=True))
        token_log_probs = np.take_along_axis(
            log_probs, targets[:, :, None], axis=-1
        )[:, :, 0]
        positions = np.arange(targets.shape[1])[None, :]
        total = np.where(positions < lengths[:, None], token_log_probs, 0.0)
        total = total.sum(axis=1)
        penalty = search.length_penalty(
            lengths, length_penalty, length_penalty_style
        )
        penalty = ops.convert_to_numpy(penalty).astype("float64")
        return total, lengths, total / penalty


def _vocabulary_fix(model, setting):
    """The end of the message for token ids outside ``model``'s
    vocabulary."""
    return (
        f"the model's {setting} is {getattr(model, setting)}. Encode the "
        "text with the tokenizer the model was trained with."
    )


def check_settings(
    method,
    beam_size,
    num_return_sequences,
    length_penalty,
    length_penalty_style,
    early_stopping,
    temperature,
    top_k,
    top_p,
):
    """Raises a ValueError naming the first setting `generate` cannot
    search with."""
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size} must be at least 1.")
    search.check_num_return_sequences(num_return_sequences, method, beam_size)
    search.check_length_penalty(length_penalty, length_penalty_style)
    search.check_choice("early_stopping", early_stopping, search.EARLY_STOPPING)
    if method != "sample":
        return
    search.check_finite("temperature", temperature)
    search.check_finite("top_p", top_p)
    if temperature <= 0:
        raise ValueError(
            f"temperature={temperature} must be > 0; use "
            'method="greedy" for the argmax.'
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1].")
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0.")


def hypothesis_lengths(token_ids, end_id=3, pad_id=0):
    """``|Y|`` of each row of ``(batch, length)`` hypotheses: through the
    first end token, or the number of non-padding tokens if none."""
    token_ids = np.asarray(token_ids)
    is_end = token_ids == end_id
    has_end = is_end.any(axis=1)
    first_end = np.argmax(is_end, axis=1) + 1
    non_pad = (token_ids != pad_id).sum(axis=1)
    return np.where(has_end, first_end, non_pad).astype("int32")
