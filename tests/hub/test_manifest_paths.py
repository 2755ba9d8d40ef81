"""A manifest is data from the Hub: entries that would read a file
outside the translator's directory are refused before any file is read."""

import hashlib
import json
import os

import pytest

from keras_transformer import hub


@pytest.fixture
def folder(tmp_path):
    """A directory with two files and their manifest, next to a secret
    file outside it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the loader\n")
    directory = tmp_path / "outer" / "translator"
    (directory / "tokenizer").mkdir(parents=True)
    (directory / "config.json").write_text("{}\n")
    (directory / "tokenizer" / "tokenizer.json").write_text("{}\n")
    hub.write_manifest(directory)
    return directory, secret


def _add_entry(directory, name, path=None):
    """Adds ``name`` to the manifest, with the true sha256 of ``path``
    (so that only the path check can refuse it), and makes the first
    real entry corrupt: were any file read before the paths are checked,
    its ChecksumError would come first."""
    manifest = json.loads((directory / "manifest.json").read_text())
    data = b"" if path is None else path.read_bytes()
    manifest["files"][name] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    manifest["files"]["config.json"]["sha256"] = "0" * 64
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "name, problem",
    [
        ("../../secret.txt", "leaves the directory through '..'"),
        ("../../../../../etc/passwd", "leaves the directory through '..'"),
        ("tokenizer/../../../secret.txt", "through '..'"),
        ("..\\..\\secret.txt", "through '..'"),
        ("/etc/passwd", "an absolute path"),
        ("SECRET_ABSOLUTE", "an absolute path"),
        ("C:\\Windows\\win.ini", "an absolute path"),
        ("", "not a relative file path"),
    ],
)
def test_entries_leaving_the_directory_are_refused(folder, name, problem):
    directory, secret = folder
    name = str(secret) if name == "SECRET_ABSOLUTE" else name
    _add_entry(directory, name, secret)
    with pytest.raises(hub.ManifestPathError) as error:
        hub.verify_directory(directory)
    message = str(error.value)
    assert message.startswith(f"manifest.json in {str(directory)!r} lists ")
    assert repr(name) in message and problem in message
    assert "refusing to read any file" in message
    assert "\n" not in message
    # Nothing of the outside file was read or hashed into the message.
    secret_hash = hashlib.sha256(secret.read_bytes()).hexdigest()
    assert secret_hash not in message and "sha256 is" not in message


def test_symbolic_link_out_of_the_directory_is_refused(folder):
    directory, secret = folder
    os.symlink(secret, directory / "tokenizer" / "extra.model")
    _add_entry(directory, "tokenizer/extra.model", secret)
    with pytest.raises(
        hub.ManifestPathError,
        match=r"lists 'tokenizer/extra.model', a symbolic link that "
        r"resolves outside the directory; refusing",
    ):
        hub.verify_directory(directory)
    # A link that resolves inside `root` (a cache snapshot's blobs) is
    # read: the corrupt config.json is then what stops loading.
    with pytest.raises(hub.ChecksumError, match="config.json"):
        hub.verify_directory(directory, root=secret.parent)


def test_links_inside_the_directory_are_verified(folder):
    directory, _ = folder
    os.symlink(
        directory / "config.json", directory / "tokenizer" / "config.json"
    )
    hub.write_manifest(directory)
    manifest = hub.verify_directory(directory)
    assert sorted(manifest["files"]) == [
        "config.json",
        "tokenizer/config.json",
        "tokenizer/tokenizer.json",
    ]
