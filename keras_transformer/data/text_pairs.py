"""Batches of raw string pairs for `fit` on text."""

import tensorflow as tf


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
