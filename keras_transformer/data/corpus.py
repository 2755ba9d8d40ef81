"""Readers for parallel corpora: aligned text files (plain or gzip) and TSV.

Readers are strict: a missing file, invalid UTF-8 or misaligned files raise
an error that names the file, the line and the fix. Pairs they drop (an
empty side, or longer than a limit) are counted in a `CorpusStats` and
logged, never dropped silently.
"""

import dataclasses
import gzip
import logging
import os

logger = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass
class CorpusStats:
    """Counts of the sentence pairs read, kept and dropped.

    Attributes:
        read: pairs read from the input.
        kept: pairs kept (``read - dropped_empty - dropped_too_long``).
        dropped_empty: pairs dropped because one side is empty (or only
            whitespace).
        dropped_too_long: pairs dropped because one side is over the length
            limit.
    """

    read: int = 0
    kept: int = 0
    dropped_empty: int = 0
    dropped_too_long: int = 0

    def report(self, name="corpus"):
        """Logs the counts (a warning when pairs were dropped); returns a
        one-line summary."""
        message = (
            f"{name}: read {self.read} pairs, kept {self.kept}, dropped "
            f"{self.dropped_empty} with an empty side and "
            f"{self.dropped_too_long} over the length limit."
        )
        if self.dropped_empty or self.dropped_too_long:
            logger.warning(message)
        else:
            logger.info(message)
        return message


def _check_exists(path):
    path = os.fspath(path)
    if os.path.isdir(path):
        # IsADirectoryError is an OSError, which the CLI does not print
        # as one line; a directory is a wrong value, hence ValueError.
        raise ValueError(
            f"Corpus file {path!r} is a directory, not a text file. Pass "
            "the file inside it (e.g. train.en), one sentence per line."
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Corpus file not found: {path!r}. Check the path, or fetch a "
            "public corpus with keras_transformer.data.load_dataset(...)."
        )
    return path


def _open_binary(path):
    """Opens a plain or gzip file for reading bytes, by content not name."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return open(path, "rb")


def read_lines(path, strip=True):
    """Reads a UTF-8 text file (plain or gzip), one sentence per line.

    Line ends (``\\n`` or ``\\r\\n``) are removed, and with ``strip``
    the surrounding whitespace too.

    Args:
        path: the file.
        strip: strip whitespace around each line.

    Returns:
        A list of str, one per line.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not valid UTF-8 (the message names the file
            and the line number).
    """
    path = _check_exists(path)
    lines = []
    with _open_binary(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}: line {number} is not valid UTF-8 "
                    f"({error.reason} at byte {error.start} of the line). "
                    "Re-encode the file as UTF-8, e.g. "
                    f"`iconv -f latin1 -t utf-8 {path}`."
                ) from error
            line = line.rstrip("\r\n")
            lines.append(line.strip() if strip else line)
    return lines


def _filter_pairs(sources, targets, max_characters, name):
    stats = CorpusStats(read=len(sources))
    pairs = []
    for source, target in zip(sources, targets, strict=True):
        if not source or not target:
            stats.dropped_empty += 1
        elif max_characters is not None and (
            len(source) > max_characters or len(target) > max_characters
        ):
            stats.dropped_too_long += 1
        else:
            pairs.append((source, target))
    stats.kept = len(pairs)
    stats.report(name)
    return pairs, stats


def read_parallel_corpus(source_path, target_path, max_characters=None):
    """Reads a parallel corpus from two aligned files (plain or gzip).

    Line i of the source file is the translation of line i of the target
    file. Pairs with an empty side, or (with ``max_characters``) a side
    longer than that, are dropped and counted.

    Args:
        source_path, target_path: the two files, UTF-8.
        max_characters: optional limit on the characters of each side.
            `translation_dataset` also limits the length in tokens.

    Returns:
        ``(pairs, stats)``: a list of ``(source, target)`` str pairs and a
        `CorpusStats`.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: invalid UTF-8 (file and line), or the files have
            different numbers of lines (both counts).

    Example:
    >>> pairs, stats = read_parallel_corpus("train.en", "train.de")
    >>> stats.kept
    29000
    """
    sources = read_lines(source_path)
    targets = read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"The source and target files must have one line per sentence "
            f"pair, but {os.fspath(source_path)!r} has {len(sources)} lines "
            f"and {os.fspath(target_path)!r} has {len(targets)}. Align the "
            "files (line i of one must translate line i of the other)."
        )
    name = f"{os.fspath(source_path)} / {os.fspath(target_path)}"
    return _filter_pairs(sources, targets, max_characters, name)


def read_tsv(path, source_column=0, target_column=1, max_characters=None):
    """Reads a parallel corpus from a tab-separated file (plain or gzip).

    Every line must have the same number of tab-separated fields, at least
    ``max(source_column, target_column) + 1``.

    Args:
        path: the file, UTF-8.
        source_column, target_column: the columns of each side.
        max_characters: optional limit on the characters of each side.

    Returns:
        ``(pairs, stats)`` as `read_parallel_corpus`.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: invalid UTF-8, or a line with too few fields (file,
            line number and count).
    """
    needed = max(source_column, target_column) + 1
    sources, targets = [], []
    lines = read_lines(path, strip=False)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            # A blank line is a pair with two empty sides.
            sources.append("")
            targets.append("")
            continue
        fields = line.split("\t")
        if len(fields) < needed:
            raise ValueError(
                f"{os.fspath(path)}: line {number} has {len(fields)} "
                f"tab-separated field(s), but column {needed - 1} is "
                f"needed (source_column={source_column}, "
                f"target_column={target_column}). Fix the line, or pick "
                "the columns with source_column= and target_column=."
            )
        sources.append(fields[source_column].strip())
        targets.append(fields[target_column].strip())
    return _filter_pairs(sources, targets, max_characters, os.fspath(path))
