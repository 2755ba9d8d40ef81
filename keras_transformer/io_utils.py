"""Reading and writing the package's JSON files.

Configurations, manifests, training records and training states are all
small JSON files; these two functions are the one place that reads and
writes them.
"""

import json
import os


def read_json(path):
    """The JSON value in the UTF-8 file ``path``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is not valid JSON (the message names the
            file; the error is a `json.JSONDecodeError`).
    """
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        # Still a JSONDecodeError (a ValueError), now naming the file.
        raise json.JSONDecodeError(
            f"{path} is not valid JSON: {error.msg}", error.doc, error.pos
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
