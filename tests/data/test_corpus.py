import gzip
import logging

import pytest

from keras_transformer.data import (
    CorpusStats,
    read_lines,
    read_parallel_corpus,
    read_tsv,
)


def write(path, text, compress=False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    if compress:
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def test_reads_aligned_plain_and_gzip_files(tmp_path):
    source = write(tmp_path / "a.en", "One.\nTwo.\r\n  Three.  \n")
    target = write(tmp_path / "a.de.gz", "Eins.\nZwei.\nDrei.\n", True)
    pairs, stats = read_parallel_corpus(source, target)
    assert pairs == [("One.", "Eins."), ("Two.", "Zwei."), ("Three.", "Drei.")]
    assert stats == CorpusStats(read=3, kept=3)


def test_gzip_detected_by_content_not_name(tmp_path):
    path = write(tmp_path / "plain.txt", "Hallo.\n", compress=True)
    assert read_lines(path) == ["Hallo."]


def test_empty_and_long_pairs_are_dropped_counted_and_logged(tmp_path, caplog):
    source = write(tmp_path / "s", "a\n\nccc\n   \nlong long long\ne\n")
    target = write(tmp_path / "t", "A\nB\n\nD\nE\nE\n")
    with caplog.at_level(logging.WARNING):
        pairs, stats = read_parallel_corpus(source, target, max_characters=5)
    assert pairs == [("a", "A"), ("e", "E")]
    assert stats == CorpusStats(
        read=6, kept=2, dropped_empty=3, dropped_too_long=1
    )
    assert "dropped 3 with an empty side and 1 over the length" in caplog.text


def test_different_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "s.en", "a\nb\nc\n")
    target = write(tmp_path / "t.de", "A\nB\n")
    with pytest.raises(ValueError) as info:
        read_parallel_corpus(source, target)
    message = str(info.value)
    assert "s.en" in message and "has 3 lines" in message
    assert "t.de" in message and "has 2" in message
    assert "Align the files" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    source = write(tmp_path / "s.en", b"fine\nalso fine\nbad \xff byte\n")
    target = write(tmp_path / "t.de", "a\nb\nc\n")
    with pytest.raises(ValueError, match=r"s\.en: line 3 is not valid UTF-8"):
        read_parallel_corpus(source, target)
    with pytest.raises(ValueError, match="iconv"):
        read_lines(source)


def test_invalid_utf8_in_gzip_names_line(tmp_path):
    path = write(tmp_path / "s.gz", b"ok\n\xc3\x28\n", compress=True)
    with pytest.raises(ValueError, match="line 2"):
        read_lines(path)


def test_missing_file_names_path_and_fix(tmp_path):
    present = write(tmp_path / "t.de", "a\n")
    with pytest.raises(FileNotFoundError, match=r"missing\.en.*load_dataset"):
        read_parallel_corpus(tmp_path / "missing.en", present)


def test_directory_in_place_of_a_file_is_named_as_a_directory(tmp_path):
    present = write(tmp_path / "t.de", "a\n")
    (tmp_path / "train.en").mkdir()
    with pytest.raises(ValueError, match=r"train\.en' is a directory"):
        read_parallel_corpus(tmp_path / "train.en", present)
    with pytest.raises(ValueError, match="is a directory"):
        read_lines(tmp_path / "train.en")


def test_tsv(tmp_path):
    path = write(
        tmp_path / "c.tsv",
        "src one\ttgt one\textra\n\t\nsrc two\t\nsrc three\ttgt three\n",
    )
    pairs, stats = read_tsv(path)
    assert pairs == [("src one", "tgt one"), ("src three", "tgt three")]
    assert stats == CorpusStats(read=4, kept=2, dropped_empty=2)
    swapped, _ = read_tsv(path, source_column=1, target_column=0)
    assert swapped[0] == ("tgt one", "src one")


def test_tsv_with_too_few_fields_names_line_and_count(tmp_path):
    path = write(tmp_path / "c.tsv", "a\tb\nno tab here\n")
    with pytest.raises(ValueError, match=r"c\.tsv: line 2 has 1 tab"):
        read_tsv(path)
    with pytest.raises(ValueError, match="column 2 is needed"):
        read_tsv(write(tmp_path / "d.tsv", "a\tb\n"), target_column=2)
