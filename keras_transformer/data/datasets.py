"""A small catalogue of public parallel corpora: Multi30k and WMT14 EN-DE.

`load_dataset` returns the paths of a split's two aligned text files. On
first use the files are downloaded from their public URLs into a cache
directory (``$KERAS_TRANSFORMER_DATA``, default
``~/.cache/keras_transformer/datasets``) and verified by SHA-256; on a
machine without internet, pass ``data_dir=`` a directory holding the files.

Checksums. Multi30k is pinned to a commit of github.com/multi30k/dataset
and verified against the SHA-256 of the *decompressed* text, which does not
depend on how the ``.gz`` was written. The WMT14 archives on statmt.org
have no published checksums: their SHA-256 is recorded on first download
in a ``.sha256`` file next to the archive (trust on first use) and every
later use is verified against it.
"""

import collections
import gzip
import hashlib
import logging
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request

from keras_transformer.data.corpus import read_parallel_corpus

logger = logging.getLogger(__name__)

ENV_VARIABLE = "KERAS_TRANSFORMER_DATA"

ParallelFiles = collections.namedtuple("ParallelFiles", ["source", "target"])
ParallelFiles.__doc__ = """Paths of a split's aligned source and target
files; unpacks as ``source, target = load_dataset(...)``."""

_MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
_MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/"
    f"{_MULTI30K_COMMIT}/data/task1/raw/{{name}}.{{language}}.gz"
)
# split: (upstream name, local names, SHA-256 of the decompressed text).
_MULTI30K = {
    "train": (
        "train",
        ("train",),
        {
            "en": "460a15fbd157e34a7a9957ee388c1ca2"
            "47fe47af3ef25fb50442af6c274e0fc6",
            "de": "2c2b73fd2b548fbcde3a875e0a78d6ee"
            "94d498bfdee6bd3eae3945779e9ddf72",
        },
    ),
    "valid": (
        "val",
        ("valid", "val"),
        {
            "en": "1f2a23d992769b5b3d209b0a10dd0b77"
            "c08cceb1f20dfb97ed0aafa49d107227",
            "de": "660e09eb7e1da2f856ea13ee5ad3cf6d"
            "36b3d5b0b733c857e94c5747a3dfc660",
        },
    ),
    "test2016": (
        "test_2016_flickr",
        ("test2016", "test_2016_flickr", "test"),
        {
            "en": "399a4382932c1aadd3ceb9bef1008d38"
            "8a64c76d4ae4e9d4728c6f4301cac182",
            "de": "4be6b5b3236b79c25475c6bb829800a7"
            "ce559e9ba7a1f6c2394fe4d40be46d16",
        },
    ),
}

# name: (URL, SHA-256 or None for trust on first use).
_WMT14_ARCHIVES = {
    "europarl": (
        "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
        None,
    ),
    "commoncrawl": (
        "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
        None,
    ),
    "news_commentary": (
        "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
        None,
    ),
    "dev": ("https://www.statmt.org/wmt14/dev.tgz", None),
    "test": ("https://www.statmt.org/wmt14/test-full.tgz", None),
}
# split: (local names, [(archive, member basename per language)]). The
# training split is the paper's: Europarl v7, Common Crawl and News
# Commentary v9, about 4.5M pairs (section 5.1).
_WMT14 = {
    "train": (
        ("train",),
        [
            ("europarl", "europarl-v7.de-en.{language}"),
            ("commoncrawl", "commoncrawl.de-en.{language}"),
            ("news_commentary", "news-commentary-v9.de-en.{language}"),
        ],
    ),
    "newstest2013": (
        ("newstest2013", "valid"),
        [("dev", "newstest2013.{language}")],
    ),
    "newstest2014": (
        ("newstest2014", "test"),
        [("test", "newstest2014-deen-{side}.{language}.sgm")],
    ),
}

DATASETS = {
    "multi30k": tuple(_MULTI30K),
    "wmt14_en_de": tuple(_WMT14),
}


def cache_dir():
    """The download cache: ``$KERAS_TRANSFORMER_DATA`` or
    ``~/.cache/keras_transformer/datasets``."""
    return os.environ.get(ENV_VARIABLE) or os.path.join(
        os.path.expanduser("~"), ".cache", "keras_transformer", "datasets"
    )


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checksum_error(what, expected, actual, path):
    return ValueError(
        f"Checksum mismatch for {what}: expected sha256 {expected}, got "
        f"{actual}. The download is corrupt or the file changed upstream. "
        f"Delete {path!r} (if present) and try again, or pass data_dir= a "
        "directory with files you trust."
    )


def download(url, path, sha256=None, decompress=False, timeout=60):
    """Downloads a URL to a file atomically and verifies its SHA-256.

    The file is written under a temporary name in the same directory and
    renamed when complete and verified, so that an interrupted download
    never leaves a file that looks complete.

    Args:
        url: the URL (``https://``, ``http://`` or ``file://``).
        path: the destination file; if it exists it is verified and kept.
        sha256: the expected SHA-256 of the file (hex). None: trust on first
            use, recording it in ``path + ".sha256"`` and verifying later
            uses against that record.
        decompress: gunzip the download; ``sha256`` is then the checksum of
            the decompressed file.
        timeout: seconds to wait for the server.

    Returns:
        ``path``.

    Raises:
        ValueError: the checksum does not match.
        OSError: the download failed.
    """
    path = os.fspath(path)
    record = path + ".sha256"
    if sha256 is None and os.path.exists(record):
        with open(record) as f:
            sha256 = f.read().split()[0]
    if os.path.exists(path):
        if sha256 is not None:
            actual = _sha256(path)
            if actual != sha256:
                raise _checksum_error(path, sha256, actual, path)
        return path
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    logger.info("Downloading %s to %s", url, path)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".download-")
    try:
        try:
            with (
                os.fdopen(fd, "wb") as f,
                urllib.request.urlopen(url, timeout=timeout) as response,
            ):
                if decompress:
                    response = gzip.GzipFile(fileobj=response)
                shutil.copyfileobj(response, f, 1 << 20)
        except (urllib.error.URLError, OSError, EOFError) as error:
            raise OSError(
                f"Could not download {url}: {error}. Check the network, "
                "or download the files on another machine and pass "
                "data_dir= the directory holding them."
            ) from error
        actual = _sha256(temporary)
        if sha256 is not None and actual != sha256:
            raise _checksum_error(url, sha256, actual, path)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    if sha256 is None:
        logger.warning(
            "%s has no published checksum; recorded its sha256 %s in %s "
            "(trust on first use) and will verify it from now on.",
            url,
            actual,
            record,
        )
        with open(record, "w") as f:
            f.write(f"{actual}  {os.path.basename(path)}\n")
    return path


def _find_local(data_dir, names, language):
    tried = []
    for name in names:
        for suffix in ("", ".gz"):
            candidate = os.path.join(data_dir, f"{name}.{language}{suffix}")
            tried.append(os.path.basename(candidate))
            if os.path.isfile(candidate):
                return candidate
            if os.path.isdir(candidate):
                raise ValueError(
                    f"{candidate!r} is a directory, not a text file. Put "
                    "the split's sentences there as a file, one per line."
                )
    raise FileNotFoundError(
        f"No {language} file in data_dir={data_dir!r}: looked for "
        f"{', '.join(tried)}. Put the split's files there under one of "
        "these names, or pass data_dir=None to download them."
    )


def _check_split(name, split):
    if name not in DATASETS:
        raise ValueError(
            f"Unknown dataset {name!r}. Choose one of {sorted(DATASETS)}."
        )
    if split not in DATASETS[name]:
        raise ValueError(
            f"Unknown split {split!r} of {name!r}. Choose one of "
            f"{list(DATASETS[name])}."
        )


def _parse_sgm(text):
    # As sacrebleu reads WMT test sets: the text of each <seg>, unescaped
    # no further.
    return [
        match.group(1).strip()
        for match in re.finditer(r"<seg[^>]*>(.*?)</seg>", text)
    ]


def _extract(archive, basename, destination):
    """Writes one member of a tar archive (found by basename) to a file;
    SGM members are converted to one sentence per line."""
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and os.path.basename(m.name) == basename
        ]
        if not members:
            raise ValueError(
                f"{archive} has no member named {basename!r}. The archive "
                "may have changed upstream; delete it to download it again, "
                "or pass data_dir=."
            )
        data = tar.extractfile(members[0]).read()
    if basename.endswith(".sgm"):
        text = data.decode("utf-8")
        data = ("\n".join(_parse_sgm(text)) + "\n").encode("utf-8")
    with open(destination, "wb") as f:
        f.write(data)


def _wmt14_file(split, language, directory):
    """Builds ``directory/split.language`` from the WMT14 archives."""
    path = os.path.join(directory, f"{split}.{language}")
    if os.path.exists(path):
        return path
    downloads = os.path.join(directory, "downloads")
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".build-")
    os.close(fd)
    try:
        with open(temporary, "wb") as out:
            for archive_name, pattern in _WMT14[split][1]:
                url, sha256 = _WMT14_ARCHIVES[archive_name]
                archive = download(
                    url,
                    os.path.join(downloads, os.path.basename(url)),
                    sha256,
                )
                # newstest2014: the English side is the "src" file of the
                # de-en test set in one direction, the German side "ref".
                side = "src" if language == "en" else "ref"
                member = pattern.format(language=language, side=side)
                part = temporary + ".part"
                _extract(archive, member, part)
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
                os.remove(part)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def load_dataset(
    name,
    split="train",
    data_dir=None,
    source_language="en",
    target_language="de",
):
    """Paths of the aligned files of a public parallel corpus.

    Datasets and splits:
        ``"multi30k"``: ``"train"`` (29,000 pairs), ``"valid"`` (1,014),
        ``"test2016"`` (1,000). Local names: ``train``, ``valid`` or
        ``val``, ``test2016``, ``test_2016_flickr`` or ``test``.
        ``"wmt14_en_de"``: ``"train"`` (Europarl v7 + Common Crawl + News
        Commentary v9, about 4.5M pairs), ``"newstest2013"`` (validation in
        the paper), ``"newstest2014"`` (test). Local names: the split name.

    Args:
        name: ``"multi30k"`` or ``"wmt14_en_de"``.
        split: see above.
        data_dir: a directory holding ``<split>.<language>`` files (plain
            or ``.gz``), used as is; None downloads into the cache
            (`cache_dir`) on first use.
        source_language, target_language: ``"en"`` and ``"de"`` in either
            order.

    Returns:
        A `ParallelFiles` ``(source, target)`` of paths.

    Example:
    >>> source, target = load_dataset("multi30k", "train")
    >>> pairs, stats = read_parallel_corpus(source, target)
    """
    _check_split(name, split)
    languages = (source_language, target_language)
    if sorted(languages) != ["de", "en"]:
        raise ValueError(
            f"{name} is English-German: source_language and "
            f"target_language must be 'en' and 'de' (in either order), got "
            f"{languages}."
        )
    if name == "multi30k":
        upstream, local_names, checksums = _MULTI30K[split]
    else:
        local_names = _WMT14[split][0]
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(
                f"data_dir={data_dir!r} is not a directory. Pass the "
                "directory holding the corpus files, or data_dir=None to "
                "download them."
            )
        return ParallelFiles(
            *(_find_local(data_dir, local_names, lang) for lang in languages)
        )
    directory = os.path.join(cache_dir(), name)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for language in languages:
        if name == "multi30k":
            url = _MULTI30K_URL.format(name=upstream, language=language)
            path = os.path.join(directory, f"{split}.{language}")
            paths.append(
                download(url, path, checksums[language], decompress=True)
            )
        else:
            paths.append(_wmt14_file(split, language, directory))
    return ParallelFiles(*paths)


def load_pairs(name, split="train", data_dir=None, **kwargs):
    """Like `load_dataset`, but reads the files: ``(pairs, stats)`` as
    `read_parallel_corpus` returns."""
    source, target = load_dataset(name, split, data_dir, **kwargs)
    return read_parallel_corpus(source, target)


__all__ = [
    "ParallelFiles",
    "cache_dir",
    "download",
    "load_dataset",
    "load_pairs",
]
