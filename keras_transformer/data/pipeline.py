"""The tf.data pipeline that feeds `Transformer.fit`.

Sentence pairs are tokenized inside the tf.data graph, given end and start
ids, and batched by length with a token budget (section 5.1: batches of
about 25,000 source and 25,000 target tokens). Each element is::

    ({"encoder_token_ids": (B, S), "encoder_padding_mask": (B, S),
      "decoder_token_ids": (B, T), "decoder_padding_mask": (B, T)},
     labels (B, T), sample_weight (B, T))

with ``encoder_token_ids = source + [end]`` (the encoder reads the whole
source at once and needs no start id), ``decoder_token_ids = [start] +
target`` (teacher forcing: the target shifted right) and ``labels = target
+ [end]``. The start, end and padding ids are the tokenizer's (0 pads
with `SubwordTokenizer`), masks are 1 on real tokens, ``sample_weight``
is 1.0 on real label tokens and 0.0 on padding. Ids and masks are int32,
``sample_weight`` float32.
"""

import dataclasses
import itertools
import logging
import os

import numpy as np
import tensorflow as tf

from keras_transformer.data.bucketing import BatchPlanner, learn_bucket_shapes
from keras_transformer.data.corpus import (
    CorpusStats,
    _filter_pairs,
    read_parallel_corpus,
)
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.utils import first_invalid_token_id

logger = logging.getLogger(__name__)

# Sentences per call of the tokenizer when tokenizing the corpus.
_TOKENIZE_CHUNK = 4096


def _read_sides(source, target):
    if isinstance(source, (str, os.PathLike)) != isinstance(
        target, (str, os.PathLike)
    ):
        raise ValueError(
            "source and target must both be file paths or both be lists of "
            f"str, got {type(source).__name__} and {type(target).__name__}."
        )
    if isinstance(source, (str, os.PathLike)):
        return read_parallel_corpus(source, target)
    source, target = list(source), list(target)
    if len(source) != len(target):
        raise ValueError(
            f"source has {len(source)} sentences and target has "
            f"{len(target)}; they must be aligned one to one. Pass lists of "
            "the same length."
        )
    for name, side in (("source", source), ("target", target)):
        for i, sentence in enumerate(side):
            if not isinstance(sentence, str):
                raise ValueError(
                    f"{name}[{i}] is a {type(sentence).__name__}, not a str."
                    " Decode the corpus to str first."
                )
    return _filter_pairs(
        [s.strip() for s in source],
        [t.strip() for t in target],
        None,
        "sentence lists",
    )


def _tokenize_corpus(tokenizer, sentences, num_parallel_calls, side):
    """Token ids of every sentence of one side, tokenized in a tf.data
    graph; with a tokenizer that has a ``tokenize_target`` (a Marian
    model's, whose sides have their own SentencePiece models), in Python
    with the side's own method."""
    if hasattr(tokenizer, "tokenize_target"):
        tokenize = (
            tokenizer.tokenize_target
            if side == "target"
            else tokenizer.tokenize
        )
        rows = tokenize(list(sentences))
        return tf.RaggedTensor.from_row_lengths(
            np.asarray([i for row in rows for i in row], np.int32),
            np.asarray([len(row) for row in rows], np.int64),
        )
    chunks = (
        tf.data.Dataset.from_tensor_slices(tf.constant(sentences, tf.string))
        .batch(_TOKENIZE_CHUNK)
        .map(
            tf.autograph.experimental.do_not_convert(tokenizer.tokenize),
            num_parallel_calls=num_parallel_calls,
            deterministic=True,
        )
    )
    return tf.concat(list(chunks), axis=0)


def _shapes_from_boundaries(bucket_boundaries):
    boundaries = sorted(int(b) for b in bucket_boundaries)
    if not boundaries or boundaries[0] < 2:
        raise ValueError(
            f"bucket_boundaries={list(bucket_boundaries)} must be a "
            "non-empty list of padded lengths of at least 2 (one token and "
            "the end id)."
        )
    return [(b, b) for b in boundaries]


def translation_dataset(
    source,
    target,
    tokenizer,
    max_tokens=4096,
    shuffle=True,
    seed=None,
    deterministic=False,
    bucket_boundaries=None,
    max_length=256,
    repeat=False,
    num_buckets=16,
    num_parallel_calls=tf.data.AUTOTUNE,
    batch_multiple=1,
):
    """A tf.data pipeline of padded, length-bucketed translation batches.

    Pairs with an empty side are dropped and counted, and so are pairs
    whose encoder or decoder sequence (with its end or start id) would be
    longer than ``max_length``; the counts are logged and kept in
    ``dataset.corpus_stats``.

    Batches are padded to one of at most ``num_buckets`` fixed shapes
    (``dataset.batch_shapes``), each within ``max_tokens`` padded tokens
    per side, and every pair is in exactly one batch of an epoch (see
    `BatchPlanner`).

    Args:
        source, target: paths of two aligned text files (plain or gzip),
            or two lists of str.
        tokenizer: a `SubwordTokenizer`.
        max_tokens: the token budget of a batch, per side:
            ``batch_size * padded_length <= max_tokens`` (25,000 in the
            paper).
        shuffle: shuffle the pairs and the batches each epoch.
        seed: seed of the shuffling; epoch e of two datasets with the same
            seed has the same batches.
        deterministic: keep the order of elements through the parallel
            map, so that the same seed also gives the same order of
            batches. Otherwise the parallel map may reorder batches for
            speed (their contents stay the same). Without ``shuffle``
            the order is always kept.
        bucket_boundaries: padded lengths to use for both sides, e.g.
            ``[16, 32, 64]``; ``[n]`` pads every pair to ``n`` (fixed-length
            padding). None (default) learns up to ``num_buckets`` shapes
            from the corpus lengths (`learn_bucket_shapes`).
        max_length: the longest encoder or decoder sequence kept, start
            or end id included; set the model's ``max_sequence_length`` to
            at least this.
        repeat: repeat epochs forever (pass ``steps_per_epoch`` to
            ``fit``); each iteration of a non-repeated dataset is the next
            epoch.
        num_buckets: the most bucket shapes when they are learned.
        num_parallel_calls: parallelism of the maps that tokenize the
            corpus and that build the batches.
        batch_multiple: make every batch size a multiple of this, the
            number of data-parallel replicas (`keras_transformer.
            distribute`), within the same ``max_tokens``; short batches
            are padded with empty rows of ``sample_weight`` 0.

    Returns:
        A ``tf.data.Dataset`` of ``(inputs, labels, sample_weight)``, with
        attributes ``corpus_stats`` (a `CorpusStats`), ``batch_shapes``
        (the ``(batch_size, source_length, target_length)`` of each
        bucket) and ``planner`` (the `BatchPlanner`).

    Example:
    >>> ds = translation_dataset("train.en", "train.de", tokenizer,
    ...                          max_tokens=4096, shuffle=True, seed=0)
    >>> model.fit(ds, epochs=10)
    """
    if int(max_tokens) != max_tokens or max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be a positive int.")
    if int(max_length) != max_length or max_length < 2:
        raise ValueError(
            f"max_length={max_length} must be an int of at least 2 (one "
            "token and the end or start id)."
        )
    corpus = _tokenized_corpus(
        source, target, tokenizer, max_length, num_parallel_calls
    )
    if bucket_boundaries is None:
        shapes = learn_bucket_shapes(
            corpus.source_lengths, corpus.target_lengths, num_buckets
        )
    else:
        shapes = _shapes_from_boundaries(bucket_boundaries)
    planner = BatchPlanner(
        corpus.source_lengths,
        corpus.target_lengths,
        shapes,
        max_tokens,
        batch_multiple,
    )
    # Without shuffling, batches keep the corpus order.
    deterministic = bool(deterministic) or not shuffle
    plans = tf.data.Dataset.from_generator(
        _plan_generator(planner, shuffle, seed, repeat),
        output_signature=(
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([None], tf.int64),
        ),
    )
    # The ids ride along with every plan (by reference, not copied) rather
    # than being captured by the map function, which would copy them into
    # its graph.
    ids = tf.data.Dataset.from_tensors(
        (
            (corpus.source_ids.values, corpus.source_ids.row_splits),
            (corpus.target_ids.values, corpus.target_ids.row_splits),
        )
    ).repeat()
    dataset = tf.data.Dataset.zip(plans, ids).map(
        _batch_function(planner, tokenizer),
        num_parallel_calls=num_parallel_calls,
        deterministic=deterministic,
    )
    if not repeat:
        # Known length: Keras shows progress and never mistakes a shorter
        # epoch for the end of the data.
        dataset = dataset.apply(
            tf.data.experimental.assert_cardinality(planner.num_batches)
        )
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if deterministic:
        options = tf.data.Options()
        options.deterministic = True
        dataset = dataset.with_options(options)
    dataset.corpus_stats = corpus.stats
    dataset.batch_shapes = planner.batch_shapes
    dataset.planner = planner
    return dataset


@dataclasses.dataclass
class _TokenizedCorpus:
    """The kept pairs' token ids, without start or end ids, and the padded
    length each side needs."""

    source_ids: tf.RaggedTensor  # (pairs, None) int32
    target_ids: tf.RaggedTensor  # (pairs, None) int32
    source_lengths: np.ndarray  # (pairs,) source + end
    target_lengths: np.ndarray  # (pairs,) start + target
    stats: CorpusStats


def _tokenized_corpus(source, target, tokenizer, max_length, parallel_calls):
    """Reads and tokenizes the pairs, drops (and counts) those longer than
    ``max_length`` with the end or start id, and logs the counts."""
    pairs, stats = _read_sides(source, target)
    if not pairs:
        raise ValueError(
            f"No sentence pair to batch ({stats.report()}). Check the "
            "corpus files or lists."
        )
    # The corpus is tokenized once, in a tf.data graph; each epoch then
    # only gathers and pads ids.
    source_ids = _tokenize_corpus(
        tokenizer, [p[0] for p in pairs], parallel_calls, "source"
    )
    target_ids = _tokenize_corpus(
        tokenizer, [p[1] for p in pairs], parallel_calls, "target"
    )
    for side, ids in (("source", source_ids), ("target", target_ids)):
        _check_tokenizer_ids(side, ids, tokenizer, pairs)
    del pairs
    # Padded lengths: source + end, start + target (= target + end).
    source_lengths = source_ids.row_lengths().numpy() + 1
    target_lengths = target_ids.row_lengths().numpy() + 1
    keep = (source_lengths <= max_length) & (target_lengths <= max_length)
    if not keep.all():
        dropped = int((~keep).sum())
        stats = dataclasses.replace(
            stats,
            kept=stats.kept - dropped,
            dropped_too_long=stats.dropped_too_long + dropped,
        )
        logger.warning(
            "Dropped %d pair(s) longer than max_length=%d tokens (with the "
            "end or start id); raise max_length to keep them.",
            dropped,
            max_length,
        )
        source_ids = tf.ragged.boolean_mask(source_ids, keep)
        target_ids = tf.ragged.boolean_mask(target_ids, keep)
        source_lengths = source_lengths[keep]
        target_lengths = target_lengths[keep]
    if not keep.any():
        raise ValueError(
            f"No sentence pair is under max_length={max_length} tokens "
            f"({stats.report()}). Raise max_length."
        )
    stats.report("translation_dataset")
    return _TokenizedCorpus(
        source_ids, target_ids, source_lengths, target_lengths, stats
    )


def _check_tokenizer_ids(side, ids, tokenizer, pairs):
    """Raises a ValueError naming the first id the tokenizer gave that is
    not in ``[0, tokenizer.vocabulary_size)``: its sentence, position and
    value. The model would read no embedding row for it (NaN on JAX)."""
    size = getattr(tokenizer, "vocabulary_size", None)
    bound = np.iinfo(np.int64).max if size is None else int(size)
    values = ids.values.numpy()
    index = first_invalid_token_id(values, bound)
    if index is None:
        return
    flat = int(index[0])
    splits = ids.row_splits.numpy()
    row = int(np.searchsorted(splits, flat, side="right")) - 1
    column = flat - int(splits[row])
    sentence = pairs[row][0 if side == "source" else 1]
    raise ValueError(
        f"{side}_ids[{row}, {column}] = {values[flat].item()} is outside "
        f"[0, {size}): the tokenizer gave token {column} of {side} "
        f"sentence {row} ({sentence[:60]!r}) an id outside its "
        "vocabulary_size. Use a tokenizer whose ids are below its "
        "vocabulary_size (train_tokenizer or load_tokenizer)."
    )


def _plan_generator(planner, shuffle, seed, repeat):
    """The generator function of the batch plans ``(bucket, indices)``:
    each call (each iteration of the dataset) plays the next epoch, or
    every epoch from the next one on when ``repeat``."""
    epochs = itertools.count()

    def plans():
        epoch = next(epochs)
        while True:
            yield from planner.batches(epoch, shuffle, seed)
            if not repeat:
                return
            epoch = next(epochs)

    return plans


def _batch_function(planner, tokenizer):
    """The map from a plan and the corpus's ids to one padded batch of
    ``(inputs, labels, sample_weight)`` in its bucket's shape, with the
    tokenizer's start, end and padding ids."""
    start_id = getattr(tokenizer, "start_id", START_ID)
    end_id = getattr(tokenizer, "end_id", END_ID)
    pad_id = getattr(tokenizer, "pad_id", PAD_ID)
    batch_sizes = tf.constant(planner.batch_sizes, tf.int32)
    source_pads = tf.constant([s for s, _ in planner.shapes], tf.int32)
    target_pads = tf.constant([t for _, t in planner.shapes], tf.int32)

    # Plain TensorFlow ops, no Python control flow: skip autograph.
    @tf.autograph.experimental.do_not_convert
    def to_batch(plan, corpus):
        bucket, indices = plan
        source_ids, target_ids = (
            tf.gather(
                tf.RaggedTensor.from_row_splits(
                    values, row_splits, validate=False
                ),
                indices,
            )
            for values, row_splits in corpus
        )
        rows = tf.shape(indices, out_type=tf.int64)[:1]
        ones = tf.ones(rows, tf.int64)
        end = tf.RaggedTensor.from_row_lengths(tf.fill(rows, end_id), ones)
        start = tf.RaggedTensor.from_row_lengths(tf.fill(rows, start_id), ones)
        encoder_ids = tf.concat([source_ids, end], axis=1)
        decoder_ids = tf.concat([start, target_ids], axis=1)
        labels = tf.concat([target_ids, end], axis=1)
        # Masks come from the lengths, not the ids: a Marian tokenizer's
        # start id is its padding id, and its end id is 0.
        source = tf.stack([batch_sizes[bucket], source_pads[bucket]])
        target = tf.stack([batch_sizes[bucket], target_pads[bucket]])
        encoder_mask = tf.ones_like(encoder_ids).to_tensor(0, shape=source)
        decoder_mask = tf.ones_like(decoder_ids).to_tensor(0, shape=target)
        inputs = {
            "encoder_token_ids": encoder_ids.to_tensor(pad_id, shape=source),
            "encoder_padding_mask": encoder_mask,
            "decoder_token_ids": decoder_ids.to_tensor(pad_id, shape=target),
            "decoder_padding_mask": decoder_mask,
        }
        labels = labels.to_tensor(pad_id, shape=target)
        # labels and decoder inputs have the same lengths.
        return inputs, labels, tf.cast(decoder_mask, tf.float32)

    return to_batch


@dataclasses.dataclass
class BatchStatistics:
    """Token counts over the batches of a dataset.

    Attributes:
        num_batches: batches seen.
        shapes: sorted distinct ``(batch, source_length, target_length)``.
        source_tokens, target_tokens: real (unpadded) tokens per side.
        padded_tokens: padding positions, both sides.
        max_batch_tokens: the most padded tokens on one side of a batch.
    """

    num_batches: int = 0
    shapes: list = dataclasses.field(default_factory=list)
    source_tokens: int = 0
    target_tokens: int = 0
    padded_tokens: int = 0
    max_batch_tokens: int = 0

    @property
    def num_shapes(self):
        return len(self.shapes)

    @property
    def real_tokens(self):
        return self.source_tokens + self.target_tokens

    @property
    def padding_fraction(self):
        """Padding positions over all positions, both sides."""
        total = self.real_tokens + self.padded_tokens
        return self.padded_tokens / total if total else 0.0


def batch_statistics(dataset, num_batches=None):
    """Counts real and padding tokens and distinct shapes in batches.

    Args:
        dataset: a dataset from `translation_dataset`.
        num_batches: how many batches to read (None: all; required for a
            repeated dataset).

    Returns:
        A `BatchStatistics`.
    """
    stats = BatchStatistics()
    shapes = set()
    if num_batches is not None:
        dataset = dataset.take(num_batches)
    for inputs, _, _ in dataset.as_numpy_iterator():
        encoder_mask = inputs["encoder_padding_mask"]
        decoder_mask = inputs["decoder_padding_mask"]
        shapes.add((*encoder_mask.shape, decoder_mask.shape[1]))
        source = int(encoder_mask.sum())
        target = int(decoder_mask.sum())
        stats.num_batches += 1
        stats.source_tokens += source
        stats.target_tokens += target
        stats.padded_tokens += (
            encoder_mask.size + decoder_mask.size - source - target
        )
        stats.max_batch_tokens = max(
            stats.max_batch_tokens, encoder_mask.size, decoder_mask.size
        )
    stats.shapes = sorted(shapes)
    return stats


__all__ = [
    "BatchStatistics",
    "CorpusStats",
    "batch_statistics",
    "translation_dataset",
]
