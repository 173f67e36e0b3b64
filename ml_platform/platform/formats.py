"""The lake's file formats: how a value becomes bytes and back (parquet, joblib, json).

An asset declares its format in its `ml_platform/format` metadata (`FORMAT_KEY`).
"""

import io
import json
from typing import IO, Any

import joblib
import numpy as np
import pandas as pd

FORMAT_KEY = "ml_platform/format"

EXTENSIONS = {"parquet": "parquet", "joblib": "joblib", "json": "json"}


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
        handle.write(json.dumps(value, indent=2, sort_keys=True, default=_json_value).encode())


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
        return json.load(handle)
    raise ValueError(f"unknown lake format '{fmt}'")
