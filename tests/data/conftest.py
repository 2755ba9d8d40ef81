"""Fixtures of the input pipeline tests: a small synthetic corpus written
to a temporary directory, and tokenizers trained once per session."""

import pathlib

import numpy as np
import pytest

MULTI30K = pathlib.Path(__file__).resolve().parents[2].parent / (
    "shared/data/multi30k"
)

_ENGLISH = (
    "a man woman dog child girl boy rides walks sees eats holds the red "
    "blue green big small bike ball street park house with on in under "
    "near two three people are playing running"
).split()
_GERMAN = (
    "ein mann frau hund kind mädchen junge fährt geht sieht isst hält der "
    "rote blaue grüne große kleine fahrrad ball straße park haus mit auf "
    "in unter neben zwei drei leute spielen laufen über größer"
).split()


def make_corpus(size, seed=0, max_words=12):
    """Distinct synthetic sentence pairs of varied lengths."""
    rng = np.random.default_rng(seed)
    sources, targets, seen = [], [], set()
    while len(sources) < size:
        n = int(rng.integers(1, max_words + 1))
        m = max(1, n + int(rng.integers(-2, 3)))
        source = " ".join(rng.choice(_ENGLISH, n)).capitalize() + "."
        if source in seen:
            continue
        seen.add(source)
        sources.append(source)
        targets.append(" ".join(rng.choice(_GERMAN, m)).capitalize() + ".")
    return sources, targets


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """300 pairs in ``train.en`` / ``train.de``; returns (paths, lists)."""
    directory = tmp_path_factory.mktemp("small_corpus")
    sources, targets = make_corpus(300)
    source_path = directory / "train.en"
    target_path = directory / "train.de"
    source_path.write_text("\n".join(sources) + "\n", encoding="utf-8")
    target_path.write_text("\n".join(targets) + "\n", encoding="utf-8")
    return (source_path, target_path), (sources, targets)


@pytest.fixture(scope="session")
def small_tokenizer(small_corpus):
    from keras_transformer.data import train_tokenizer

    return train_tokenizer(list(small_corpus[0]), vocabulary_size=400)


@pytest.fixture(scope="session")
def multi30k_paths():
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    return MULTI30K / "train.en", MULTI30K / "train.de"


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_paths):
    """The 8k joint vocabulary of Multi30k, trained once per session."""
    from keras_transformer.data import train_tokenizer

    return train_tokenizer(list(multi30k_paths), vocabulary_size=8000)
