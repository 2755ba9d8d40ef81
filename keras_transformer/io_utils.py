"""Reading and writing the package's JSON files, and replacing a
directory in one rename.

Configurations, manifests, training records and training states are all
small JSON files; `read_json` and `write_json` are the one place that
reads and writes them. Exports are written beside their directory and
renamed into place (`replace_directory_atomically`).
"""

import json
import os
import shutil
import tempfile


class JSONFileError(ValueError):
    """A JSON file that cannot be read: not UTF-8, or not valid JSON."""


def read_json(path):
    """The JSON value in the UTF-8 file ``path``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        JSONFileError: a ValueError naming the file and what is wrong: it
            is a directory, not UTF-8 text, or not valid JSON (with the
            line and column).
    """
    path = os.fspath(path)
    fix = "re-save or re-download it"
    if os.path.isdir(path):
        raise JSONFileError(f"{path} is a directory, not a JSON file; {fix}.")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise JSONFileError(
            f"{path} is not valid JSON (byte {error.start} is not UTF-8: "
            f"{error.reason}); {fix}."
        ) from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise JSONFileError(
            f"{path} is not valid JSON (line {error.lineno}, column "
            f"{error.colno}): {error.msg}; {fix}."
        ) from error


def write_json(path, data, *, indent=2, sort_keys=True, ensure_ascii=True):
    """Writes ``data`` to ``path`` as UTF-8 JSON ending with a newline.

    The text goes to ``path + ".partial"`` first, which then replaces
    ``path``: a reader, or a run resumed after a crash, finds either the
    old file or the new one, never half of one.

    Args:
        path: the file to write.
        data: a JSON-serializable value.
        indent, sort_keys, ensure_ascii: as in `json.dump`; ``indent=None``
            writes one line.
    """
    path = os.fspath(path)
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(
            data,
            f,
            indent=indent,
            sort_keys=sort_keys,
            ensure_ascii=ensure_ascii,
        )
        f.write("\n")
    os.replace(partial, path)


def replace_directory_atomically(directory, write):
    """Calls ``write(staging)`` on a new sibling directory of
    ``directory``, then renames it to ``directory``, moving what was
    there aside first and deleting it last."""
    parent, name = os.path.split(directory)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
    try:
        write(staging)
        if not os.path.lexists(directory):
            os.rename(staging, directory)
            return
        previous = tempfile.mkdtemp(prefix=f".{name}.previous-", dir=parent)
        aside = os.path.join(previous, name)
        os.rename(directory, aside)
        try:
            os.rename(staging, directory)
        except BaseException:
            os.rename(aside, directory)
            raise
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
