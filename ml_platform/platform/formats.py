"""The lake's file formats: how a value becomes bytes and back (parquet, joblib, json).

An asset declares its format in its `ml_platform/format` metadata (`FORMAT_KEY`).

A JSON file is strict JSON, which jq, browsers and PostgreSQL's json columns read: a number
JSON has no spelling for (NaN, an infinity: ROC AUC of a day of one class, an interval too few
bootstrap draws define) is written as null, and a document (an object) lists those nulls under
`NON_FINITE_KEY`, each JSON pointer (RFC 6901) with the number it stands for, so a reader tells
"not a number" from "absent". Read back here, each is that number again; files written before
that, with bare NaN, are read as they were.
"""

import io
import json
import math
from collections.abc import Callable
from typing import IO, Any

import joblib
import numpy as np
import pandas as pd

FORMAT_KEY = "ml_platform/format"

EXTENSIONS = {"parquet": "parquet", "joblib": "joblib", "json": "json"}
# The members of a JSON document that stand for numbers JSON has none for: pointer -> number.
NON_FINITE_KEY = "ml_platform/non_finite"


def serialise(value: Any, fmt: str) -> bytes:
    """Bytes of `value` in a lake format."""
    buffer = io.BytesIO()
    serialise_into(value, fmt, buffer)
    return buffer.getvalue()


def serialise_into(value: Any, fmt: str, handle: IO[bytes]) -> None:
    """Write `value` in a lake format to a binary file."""
    if fmt not in EXTENSIONS:
        raise ValueError(f"unknown lake format '{fmt}'")
    if fmt == "parquet":
        value.to_parquet(handle, index=False)
    elif fmt == "joblib":
        joblib.dump(value, handle)
    else:
        handle.write(json_text(value).encode())


def json_text(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`value` as strict JSON text: each NaN or infinity null, listed under `NON_FINITE_KEY`.

    `default` converts what JSON has no type for (`_json_value`: a numpy scalar's value, else
    its text). A top-level value that is no object has nowhere to list them: its nulls stay.
    """
    found: dict[str, str] = {}
    plain = _finite(value, "", found)
    if isinstance(plain, dict):
        if NON_FINITE_KEY in plain:
            # Read back, it would be taken for the list of nulls.
            raise ValueError(f"a JSON document of the lake cannot hold its own '{NON_FINITE_KEY}'")
        if found:
            plain[NON_FINITE_KEY] = found
    # allow_nan=False: a number that still is not finite (from `default`) fails here, loudly,
    # instead of writing a file no strict reader takes.
    return json.dumps(
        plain, indent=2, sort_keys=True, default=default or _json_value, allow_nan=False
    )


def _finite(value: Any, pointer: str, found: dict[str, str]) -> Any:
    """`value` with each non-finite number null, its JSON pointer noted in `found`."""
    if isinstance(value, (float, np.floating)):
        if math.isfinite(value):
            return value
        # The spellings Python's float(), JavaScript's Number() and PostgreSQL's float8 read.
        found[pointer] = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return None
    if isinstance(value, dict):
        # As json.dumps writes them: every key as text.
        return {
            key: _finite(item, f"{pointer}/{_escaped(key)}", found) for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_finite(item, f"{pointer}/{i}", found) for i, item in enumerate(value)]
    return value


def _escaped(key: Any) -> str:
    """A key as a JSON pointer's token: its JSON text, `~` and `/` escaped (RFC 6901)."""
    text = key if isinstance(key, str) else json.dumps(key)
    return text.replace("~", "~0").replace("/", "~1")


def from_json_text(text: str | bytes) -> Any:
    """The value of JSON `text` written by `json_text`: each listed null its number again."""
    value = json.loads(text)
    if not isinstance(value, dict) or NON_FINITE_KEY not in value:
        return value
    listed = value.pop(NON_FINITE_KEY)
    if not isinstance(listed, dict):
        raise ValueError(f"'{NON_FINITE_KEY}' is not an object of JSON pointers")
    for pointer, number in listed.items():
        *path, last = [
            token.replace("~1", "/").replace("~0", "~") for token in pointer.split("/")[1:]
        ]
        parent = value
        try:
            for token in path:
                parent = parent[int(token) if isinstance(parent, list) else token]
            index = int(last) if isinstance(parent, list) else last
            if parent[index] is not None:
                raise ValueError(f"it holds {parent[index]!r}")
            parent[index] = float(number)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(
                f"'{NON_FINITE_KEY}' lists {pointer!r} as {number!r}, which is no null of the "
                f"document ({type(exc).__name__}: {exc})"
            ) from exc
    return value


def _json_value(value: Any) -> Any:
    """What JSON stores for a value it has no type for: a numpy scalar's value, else its text.

    As text, a numpy scalar would come back as a string: np.bool_(False) as "False", which is
    true, and a count (np.int64) as "3", which is no number.
    """
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    return str(value)


def deserialise(data: bytes, fmt: str) -> Any:
    """The value stored as `data` in a lake format."""
    return deserialise_from(io.BytesIO(data), fmt)


def deserialise_from(handle: IO[bytes], fmt: str) -> Any:
    """The value stored in a lake format in a seekable binary file."""
    if fmt == "parquet":
        # Column by column, not the whole file buffered first (pre_buffer), and each Arrow
        # column freed once converted (self_destruct, which needs a block per column): the same
        # frame, with a peak of about 2 x its size instead of 3 x (at 1M rows a day).
        return pd.read_parquet(
            handle,
            pre_buffer=False,
            to_pandas_kwargs={"self_destruct": True, "split_blocks": True},
        )
    if fmt == "joblib":
        return joblib.load(handle)
    if fmt == "json":
        return from_json_text(handle.read())
    raise ValueError(f"unknown lake format '{fmt}'")
