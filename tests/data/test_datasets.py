import functools
import gzip
import hashlib
import http.server
import io
import tarfile
import threading

import pytest

from keras_transformer.data import datasets, load_dataset, read_lines


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def test_download_verifies_checksum_and_writes_atomically(tmp_path):
    data = b"Ein Hund.\nZwei Katzen.\n"
    source = tmp_path / "remote.txt"
    source.write_bytes(data)
    url = source.as_uri()
    path = tmp_path / "cache" / "file.txt"
    assert datasets.download(url, path, sha256(data)) == str(path)
    assert path.read_bytes() == data
    bad = tmp_path / "cache" / "bad.txt"
    with pytest.raises(ValueError, match="Checksum mismatch") as info:
        datasets.download(url, bad, "0" * 64)
    assert "expected sha256 " + "0" * 64 in str(info.value)
    assert sha256(data) in str(info.value)
    # Nothing left behind: no partial or unverified file.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "file.txt"
    ]
    # An existing file is verified again.
    path.write_bytes(b"tampered")
    with pytest.raises(ValueError, match="Checksum mismatch"):
        datasets.download(url, path, sha256(data))


def test_download_gunzips_and_checks_the_content(tmp_path):
    data = "Ein Mann fährt.\n".encode()
    source = tmp_path / "remote.gz"
    source.write_bytes(gzip.compress(data, mtime=0))
    path = tmp_path / "out.txt"
    datasets.download(source.as_uri(), path, sha256(data), decompress=True)
    assert path.read_bytes() == data


def test_trust_on_first_use_records_and_later_verifies(tmp_path):
    source = tmp_path / "remote.bin"
    source.write_bytes(b"first")
    path = tmp_path / "cache" / "archive.tgz"
    datasets.download(source.as_uri(), path, None)
    record = (tmp_path / "cache" / "archive.tgz.sha256").read_text()
    assert record.split()[0] == sha256(b"first")
    path.unlink()
    source.write_bytes(b"changed upstream")
    with pytest.raises(ValueError, match="Checksum mismatch"):
        datasets.download(source.as_uri(), path, None)


def test_download_failure_says_how_to_work_offline(tmp_path):
    with pytest.raises(OSError, match="data_dir="):
        datasets.download((tmp_path / "absent").as_uri(), tmp_path / "x")


@pytest.fixture
def local_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/www."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(root)
    )
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_over_http(local_server, tmp_path):
    root, base = local_server
    (root / "a.txt").write_bytes(b"hello\n")
    path = tmp_path / "a.txt"
    datasets.download(f"{base}/a.txt", path, sha256(b"hello\n"))
    assert path.read_bytes() == b"hello\n"


def test_multi30k_from_data_dir(multi30k_paths):
    directory = multi30k_paths[0].parent
    source, target = load_dataset("multi30k", "train", data_dir=directory)
    assert source.endswith("train.en") and target.endswith("train.de")
    # Upstream's test2016 is "test" in the shared copy.
    test = load_dataset("multi30k", "test2016", data_dir=directory)
    assert test.source.endswith("test.en")
    reverse = load_dataset(
        "multi30k",
        "valid",
        data_dir=directory,
        source_language="de",
        target_language="en",
    )
    assert reverse.source.endswith("valid.de")
    assert len(read_lines(reverse.source)) == 1014


def test_upstream_names_and_gzip_in_data_dir(tmp_path):
    for language in ("en", "de"):
        (tmp_path / f"val.{language}.gz").write_bytes(gzip.compress(b"x\n"))
    files = load_dataset("multi30k", "valid", data_dir=tmp_path)
    assert files.target.endswith("val.de.gz")
    with pytest.raises(FileNotFoundError, match="train.en, train.en.gz"):
        load_dataset("multi30k", "train", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_dataset("multi30k", "train", data_dir=tmp_path / "none")


def test_directory_named_like_a_split_file_is_refused(tmp_path):
    (tmp_path / "train.en").mkdir()
    (tmp_path / "train.de").write_text("ein Hund\n")
    with pytest.raises(ValueError, match=r"train\.en' is a directory"):
        load_dataset("multi30k", "train", data_dir=tmp_path)


def test_multi30k_download_checks_the_pinned_content(
    multi30k_paths, tmp_path, monkeypatch
):
    # The real files, gzipped and served locally: the recorded checksums
    # of the decompressed text must match them.
    shared = multi30k_paths[0].parent
    remote = tmp_path / "remote"
    remote.mkdir()
    for language in ("en", "de"):
        data = (shared / f"valid.{language}").read_bytes()
        (remote / f"val.{language}.gz").write_bytes(gzip.compress(data))
    monkeypatch.setattr(
        datasets,
        "_MULTI30K_URL",
        (remote / "{name}.{language}.gz")
        .as_uri()
        .replace("%7B", "{")
        .replace("%7D", "}"),
    )
    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", str(tmp_path / "cache"))
    source, target = load_dataset("multi30k", "valid")
    assert source == str(tmp_path / "cache" / "multi30k" / "valid.en")
    assert read_lines(target) == read_lines(shared / "valid.de")
    # A changed upstream file is refused.
    (tmp_path / "cache" / "multi30k" / "valid.de").unlink()
    (remote / "val.de.gz").write_bytes(gzip.compress(b"not it\n"))
    with pytest.raises(ValueError, match="Checksum mismatch"):
        load_dataset("multi30k", "valid")


def make_tgz(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_wmt14_builds_splits_from_archives(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    remote.mkdir()
    make_tgz(
        remote / "test-full.tgz",
        {
            "test-full/newstest2014-deen-src.en.sgm": (
                b'<srcset><doc docid="1">\n<seg id="1">A cat .</seg>\n'
                b'<seg id="2"> Two dogs. </seg>\n</doc></srcset>\n'
            ),
            "test-full/newstest2014-deen-ref.de.sgm": (
                b'<refset><doc docid="1">\n<seg id="1">Eine Katze .</seg>\n'
                b'<seg id="2">Zwei Hunde.</seg>\n</doc></refset>\n'
            ),
        },
    )
    corpora = {
        "europarl": ("training/europarl-v7.de-en", 2),
        "commoncrawl": ("commoncrawl.de-en", 1),
        "news_commentary": ("training/news-commentary-v9.de-en", 3),
    }
    archives = {"test": ((remote / "test-full.tgz").as_uri(), None)}
    for name, (prefix, count) in corpora.items():
        members = {
            f"{prefix}.{lang}": "".join(
                f"{name} {i} {lang}\n" for i in range(count)
            ).encode()
            for lang in ("en", "de")
        }
        make_tgz(remote / f"{name}.tgz", members)
        archives[name] = ((remote / f"{name}.tgz").as_uri(), None)
    monkeypatch.setattr(datasets, "_WMT14_ARCHIVES", archives)
    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", str(tmp_path / "cache"))
    test = load_dataset("wmt14_en_de", "newstest2014")
    assert read_lines(test.source) == ["A cat .", "Two dogs."]
    assert read_lines(test.target) == ["Eine Katze .", "Zwei Hunde."]
    train = load_dataset("wmt14_en_de", "train")
    lines = read_lines(train.target)
    assert len(lines) == 6 == len(read_lines(train.source))
    assert lines[0] == "europarl 0 de" and lines[-1] == "news_commentary 2 de"
    # Archives without published checksums are recorded on first use.
    records = sorted(
        (tmp_path / "cache" / "wmt14_en_de" / "downloads").glob("*.sha256")
    )
    assert len(records) == 4


def test_unknown_names():
    with pytest.raises(ValueError, match="Unknown dataset 'wmt17'"):
        load_dataset("wmt17")
    with pytest.raises(ValueError, match="Unknown split 'test'.*test2016"):
        load_dataset("multi30k", "test")
    with pytest.raises(ValueError, match="English-German"):
        load_dataset("multi30k", "train", source_language="fr")


def test_cache_dir_default_and_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KERAS_TRANSFORMER_DATA", raising=False)
    assert datasets.cache_dir().endswith(".cache/keras_transformer/datasets")
    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", str(tmp_path))
    assert datasets.cache_dir() == str(tmp_path)
