"""Input pipeline: parallel corpora, the shared subword tokenizer, and the
tf.data pipeline of padded, length-bucketed batches.

Example:
>>> import keras_transformer as kt
>>> source, target = kt.data.load_dataset("multi30k", "train")
>>> tokenizer = kt.data.train_tokenizer([source, target], 8000)
>>> tokenizer.save("out/tokenizer")
>>> tokenizer = kt.data.load_tokenizer("out/tokenizer")
>>> ds = kt.data.translation_dataset(
...     source, target, tokenizer, max_tokens=4096, shuffle=True, seed=0
... )

The tf.data pipeline (`translation_dataset`, `batch_statistics`,
`BatchStatistics`) loads TensorFlow, and loads on first use: reading
corpora and loading a tokenizer do not import TensorFlow.
"""

import importlib

from keras_transformer.data.bucketing import BatchPlanner, learn_bucket_shapes
from keras_transformer.data.corpus import (
    CorpusStats,
    read_lines,
    read_parallel_corpus,
    read_tsv,
)
from keras_transformer.data.datasets import (
    DATASETS,
    ParallelFiles,
    cache_dir,
    download,
    load_dataset,
    load_pairs,
)
from keras_transformer.data.tokenizer import (
    SubwordTokenizer,
    load_tokenizer,
    train_tokenizer,
)

# Public names of the modules that import TensorFlow, loaded on first use.
_LAZY_NAMES = {
    "BatchStatistics": "pipeline",
    "batch_statistics": "pipeline",
    "translation_dataset": "pipeline",
}


def __getattr__(name):
    if name in _LAZY_NAMES:
        module = importlib.import_module(
            f"keras_transformer.data.{_LAZY_NAMES[name]}"
        )
        return getattr(module, name)
    raise AttributeError(
        f"module 'keras_transformer.data' has no attribute {name!r}"
    )


__all__ = [
    "DATASETS",
    "BatchPlanner",
    "BatchStatistics",
    "CorpusStats",
    "ParallelFiles",
    "SubwordTokenizer",
    "batch_statistics",
    "cache_dir",
    "download",
    "learn_bucket_shapes",
    "load_dataset",
    "load_pairs",
    "load_tokenizer",
    "read_lines",
    "read_parallel_corpus",
    "read_tsv",
    "train_tokenizer",
    "translation_dataset",
]
