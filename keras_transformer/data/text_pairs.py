"""Batches of raw string pairs for `fit` on text: a number of pairs per
batch, or a token budget per batch (section 5.1)."""

import numpy as np
import tensorflow as tf

from keras_transformer.data.bucketing import BatchPlanner, learn_bucket_shapes
from keras_transformer.data.pipeline import _plan_generator

TEXT_KEYS = ("encoder_text", "decoder_text")

# Pairs per call of the preprocessor when measuring the corpus.
_MEASURE_CHUNK = 1024


def text_pair_dataset(pairs, batch_size, shuffle=True, seed=None):
    """A `tf.data.Dataset` of ``{"encoder_text", "decoder_text"}`` string
    batches, reshuffled every epoch when ``shuffle`` (as `Model.fit`
    shuffles arrays).

    Args:
        pairs: a dict of two equally long lists of str.
        batch_size: pairs per batch.
        shuffle: reshuffle the pairs every epoch.
        seed: the shuffle's seed.
    """
    dataset = tf.data.Dataset.from_tensor_slices(
        {
            key: tf.constant(list(values), tf.string)
            for key, values in pairs.items()
        }
    )
    if shuffle:
        dataset = dataset.shuffle(
            len(next(iter(pairs.values()))),
            seed=seed,
            reshuffle_each_iteration=True,
        )
    return dataset.batch(batch_size)


def check_text_pairs(x, name="x"):
    """Checks ``{"encoder_text": [...], "decoder_text": [...]}`` before
    any work: both keys, str entries, the same number of each."""
    for key in TEXT_KEYS:
        if key not in x:
            raise ValueError(
                f"{name} has no {key!r} key (it has {sorted(x)}); give "
                f"{name}={{'encoder_text': sources, 'decoder_text': targets}}."
            )
    lengths = {}
    for key in TEXT_KEYS:
        values = as_list(x[key])
        for index, value in enumerate(values):
            if not isinstance(value, (str, bytes)):
                raise ValueError(
                    f"{name}[{key!r}][{index}] is {type(value).__name__} "
                    f"{value!r}, not a str; give one str per sentence."
                )
        lengths[key] = len(values)
    if lengths["encoder_text"] != lengths["decoder_text"]:
        raise ValueError(
            f"{name}['encoder_text'] has {lengths['encoder_text']} sentences "
            f"and {name}['decoder_text'] {lengths['decoder_text']}; give one "
            "target per source."
        )


def as_list(values):
    """A list of sentences from one sentence or a sequence of them."""
    return [values] if isinstance(values, (str, bytes)) else list(values)


def is_text(value):
    """Whether ``value`` is raw text for a task: a dict or a
    `tf.data.Dataset` of dicts with an ``encoder_text`` or
    ``decoder_text`` key."""
    if isinstance(value, tf.data.Dataset):
        value = value.element_spec
    return isinstance(value, dict) and any(key in value for key in TEXT_KEYS)


def check_text_dataset(dataset, name="x"):
    """Checks, before reading it, that ``dataset`` is one pass of
    ``{"encoder_text", "decoder_text"}`` str dicts, batched or not."""
    spec = dataset.element_spec
    for key in TEXT_KEYS:
        if not isinstance(spec, dict) or key not in spec:
            raise ValueError(
                f"{name} is a dataset of {spec}, with no {key!r} key; give a "
                "dataset of {'encoder_text': str, 'decoder_text': str}."
            )
        if spec[key].dtype != tf.string or spec[key].shape.rank not in (0, 1):
            raise ValueError(
                f"{name}'s {key!r} is {spec[key]}; give str sentences, one "
                "per element or a batch of them."
            )
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            f"{name} is an endless (repeated) dataset; token-budget batching "
            "reads one pass of pairs: give the dataset before .repeat()."
        )


def read_text_dataset(dataset, name="x"):
    """The string pairs of one pass over a `tf.data.Dataset` of
    ``{"encoder_text", "decoder_text"}`` dicts, batched or not, as a dict
    of two lists of bytes."""
    check_text_dataset(dataset, name)
    batched = dataset.element_spec["encoder_text"].shape.rank == 1
    dataset = dataset.map(lambda element: {k: element[k] for k in TEXT_KEYS})
    if batched:
        dataset = dataset.unbatch()
    pairs = {key: [] for key in TEXT_KEYS}
    for batch in dataset.batch(_MEASURE_CHUNK).as_numpy_iterator():
        for key in TEXT_KEYS:
            pairs[key].extend(batch[key].tolist())
    return pairs


def token_budget_dataset(
    pairs,
    preprocessor,
    max_tokens,
    shuffle=True,
    seed=None,
    num_buckets=16,
):
    """Batches of raw string pairs by length, within a token budget.

    The pairs are batched as `keras_transformer.data.translation_dataset`
    batches files (section 5.1: batches of about 25,000 source and 25,000
    target tokens): each batch holds pairs of similar lengths, padded to
    one of at most ``num_buckets`` shapes of at most ``max_tokens`` tokens
    per side (`BatchPlanner`). Every pair is in exactly one batch of each
    epoch; none is dropped: the ``preprocessor`` turns each pair into the
    same ids, cut at its sequence lengths, as when it batches by count.

    Args:
        pairs: a dict of two equally long lists of str (or bytes),
            ``{"encoder_text": [...], "decoder_text": [...]}``.
        preprocessor: a `keras_hub.models.Seq2SeqLMPreprocessor` (padding
            on the right), e.g. `TransformerSeq2SeqLMPreprocessor`.
        max_tokens: the token budget of a batch, per side:
            ``batch_size * padded_length <= max_tokens``.
        shuffle: shuffle the pairs and the batches each epoch.
        seed: seed of the shuffling; by default drawn from NumPy's global
            state, which `keras.utils.set_random_seed` seeds.
        num_buckets: the most batch shapes.

    Returns:
        A ``tf.data.Dataset`` of preprocessed ``(inputs, labels,
        sample_weight)`` batches (a task passes them to its backbone as
        they are), each iteration the next epoch, with attributes
        ``batch_shapes`` (the ``(batch_size, encoder_length,
        decoder_length)`` of each bucket) and ``planner``.

    Example:
    >>> train = token_budget_dataset(
    ...     {"encoder_text": sources, "decoder_text": targets},
    ...     task.preprocessor, max_tokens=4096)
    >>> task.fit(train, epochs=10)
    """
    check_max_tokens(max_tokens)
    check_text_pairs(pairs, "pairs")
    texts = tuple(
        tf.constant(as_list(pairs[key]), tf.string) for key in TEXT_KEYS
    )
    if texts[0].shape[0] == 0:
        raise ValueError("pairs holds no sentence pair; give at least one.")
    source_lengths, target_lengths = _measure(texts, preprocessor)
    longest = int(max(source_lengths.max(), target_lengths.max()))
    if max_tokens < longest:
        raise ValueError(
            f"max_tokens={max_tokens} cannot hold the longest pair "
            f"({longest} tokens with its special tokens); raise max_tokens "
            "to at least that, or lower the preprocessor's sequence lengths."
        )
    planner = BatchPlanner(
        source_lengths,
        target_lengths,
        learn_bucket_shapes(source_lengths, target_lengths, num_buckets),
        max_tokens,
    )
    if shuffle and seed is None:
        seed = int(np.random.randint(2**31 - 1))
    plans = tf.data.Dataset.from_generator(
        _plan_generator(planner, shuffle, seed, repeat=False),
        output_signature=(
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([None], tf.int64),
        ),
    )
    # The sentences ride along with every plan (by reference), rather
    # than being captured by the map function, which would copy them into
    # its graph.
    texts = tf.data.Dataset.from_tensors(texts).repeat()
    dataset = (
        tf.data.Dataset.zip(plans, texts)
        .map(_batch_function(planner, preprocessor))
        .apply(tf.data.experimental.assert_cardinality(planner.num_batches))
        .prefetch(tf.data.AUTOTUNE)
    )
    dataset.batch_shapes = planner.batch_shapes
    dataset.planner = planner
    return dataset


def check_max_tokens(max_tokens):
    """Refuses a token budget that is not a positive int."""
    if (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, (int, np.integer))
        or max_tokens < 1
    ):
        raise ValueError(
            f"max_tokens={max_tokens!r} must be a positive int: the tokens "
            "of a batch, per side (the paper uses about 25,000)."
        )


def _measure(texts, preprocessor):
    """Per pair, the encoder and decoder tokens the preprocessor gives
    (special tokens included, cut at its sequence lengths)."""

    @tf.autograph.experimental.do_not_convert
    def lengths(sources, targets):
        x, _, weights = preprocessor(
            {"encoder_text": sources, "decoder_text": targets}
        )
        decoder = tf.maximum(_count(x["decoder_padding_mask"]), _count(weights))
        return _count(x["encoder_padding_mask"]), decoder

    chunks = (
        tf.data.Dataset.from_tensor_slices(texts)
        .batch(_MEASURE_CHUNK)
        .map(lengths, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    )
    source, target = zip(*chunks.as_numpy_iterator(), strict=True)
    return np.concatenate(source), np.concatenate(target)


def _count(mask):
    """Per row, the positions where ``mask`` (bool, int or float) is set."""
    return tf.reduce_sum(tf.cast(tf.cast(mask, tf.bool), tf.int64), axis=-1)


def _batch_function(planner, preprocessor):
    """The map from a plan and the sentences to one preprocessed batch in
    its bucket's shape; a short last batch gets empty rows (weight 0)."""
    batch_sizes = tf.constant(planner.batch_sizes, tf.int32)
    source_pads = tf.constant([s for s, _ in planner.shapes], tf.int32)
    target_pads = tf.constant([t for _, t in planner.shapes], tf.int32)

    @tf.autograph.experimental.do_not_convert
    def to_batch(plan, texts):
        bucket, indices = plan
        x, labels, weights = preprocessor(
            {
                key: tf.gather(sentences, indices)
                for key, sentences in zip(TEXT_KEYS, texts, strict=True)
            }
        )
        rows = batch_sizes[bucket]

        def fit(tensor, length):
            # Right padding: every real token is before ``length``.
            tensor = tensor[:, :length]
            return tf.pad(tensor, [[0, rows - tf.shape(tensor)[0]], [0, 0]])

        source, target = source_pads[bucket], target_pads[bucket]
        x = {
            key: fit(value, source if key.startswith("encoder") else target)
            for key, value in x.items()
        }
        return x, fit(labels, target), fit(weights, target)

    return to_batch
