"""Lake formats round-trip (parquet, joblib, json) and local storage replaces objects atomically."""

import datetime as dt
import os
import stat

import numpy as np
import pandas as pd
import pytest

from ml_platform.ingestion.synthetic import Drift
from ml_platform.platform.formats import deserialise, serialise
from ml_platform.platform.storage import LocalStorage, write_atomically


def typed_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "event_time": pd.to_datetime(["2024-01-01 05:15", "2024-01-01 23:59"]).astype(
                "datetime64[ns]"
            ),
            "count": pd.array([3, None], dtype="Int64"),
            "amount": [1.25, np.nan],
            "carrier": pd.Series(["UA", None], dtype="str"),
            "delayed": pd.array([1, None], dtype="Int8"),
            "flag": pd.array([True, None], dtype="boolean"),
        }
    )


def test_parquet_round_trip_keeps_values_and_dtypes():
    frame = typed_frame()
    back = deserialise(serialise(frame, "parquet"), "parquet")
    pd.testing.assert_frame_equal(back, frame)


def test_parquet_does_not_store_the_index():
    frame = typed_frame().iloc[[1]]
    back = deserialise(serialise(frame, "parquet"), "parquet")
    assert back.index.tolist() == [0]


def test_joblib_round_trip_of_python_objects():
    value = {
        "drift": Drift(feature="x1", shift_sd=1.5, start=dt.date(2024, 1, 10)),
        "weights": np.linspace(0.0, 1.0, 7),
        "frame": typed_frame(),
        "window": ["2024-01-01", "2024-01-02"],
    }

    back = deserialise(serialise(value, "joblib"), "joblib")

    assert back["drift"] == value["drift"]
    np.testing.assert_array_equal(back["weights"], value["weights"])
    pd.testing.assert_frame_equal(back["frame"], value["frame"])
    assert back["window"] == value["window"]


def test_json_round_trip_and_stable_bytes():
    metrics = {"rmse": 0.5, "mae": 0.25, "note": None, "window": ["2024-01-01"], "rows": 3}
    data = serialise(metrics, "json")
    assert deserialise(data, "json") == metrics
    reordered = dict(reversed(list(metrics.items())))
    assert serialise(reordered, "json") == data


def test_json_keeps_numpy_scalars_as_the_values_they_hold():
    value = {
        "accepted": np.bool_(False),
        "rows": np.int64(3),
        "small": np.int8(-1),
        "share": np.float32(0.5),
        "huge": np.uint64(2**64 - 1),
    }

    back = deserialise(serialise(value, "json"), "json")

    assert back == {"accepted": False, "rows": 3, "small": -1, "share": 0.5, "huge": 2**64 - 1}
    assert back["accepted"] is False


def test_json_writes_dates_as_text():
    back = deserialise(serialise({"day": dt.date(2024, 1, 2)}, "json"), "json")
    assert back == {"day": "2024-01-02"}


@pytest.mark.parametrize("fmt", ["csv", "pickle", ""])
def test_unknown_format_is_refused(fmt):
    with pytest.raises(ValueError, match="unknown lake format"):
        serialise({"a": 1}, fmt)
    with pytest.raises(ValueError, match="unknown lake format"):
        deserialise(b"{}", fmt)


def all_files(root) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def test_local_storage_write_then_read(tmp_path):
    storage = LocalStorage(base_dir=str(tmp_path))
    key = "flights/features/2013-01-01.parquet"
    assert not storage.exists(key)

    storage.write_bytes(key, b"first")

    assert storage.exists(key)
    assert storage.read_bytes(key) == b"first"
    assert storage.uri(key) == str((tmp_path / key).resolve())
    assert all_files(tmp_path) == [key]


def test_local_storage_write_replaces_atomically(tmp_path):
    storage = LocalStorage(base_dir=str(tmp_path))
    key = "synthetic/model/2024-01-28.joblib"
    storage.write_bytes(key, b"old model " * 1000)
    old_inode = (tmp_path / key).stat().st_ino

    storage.write_bytes(key, b"new")

    assert storage.read_bytes(key) == b"new"
    # Replaced by rename, not rewritten in place: a reader holding the old file keeps it whole.
    assert (tmp_path / key).stat().st_ino != old_inode
    assert all_files(tmp_path) == [key]


def test_a_reader_of_the_old_object_keeps_the_old_content(tmp_path):
    storage = LocalStorage(base_dir=str(tmp_path))
    storage.write_bytes("a/b.json", b"old content")
    with open(tmp_path / "a" / "b.json", "rb") as reader:
        storage.write_bytes("a/b.json", b"new content")
        assert reader.read() == b"old content"
    assert storage.read_bytes("a/b.json") == b"new content"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "lake" / "x.json"
    write_atomically(path, b"old")

    with pytest.raises(TypeError):
        write_atomically(path, "not bytes")  # type: ignore[arg-type]

    assert path.read_bytes() == b"old"
    assert all_files(tmp_path) == ["lake/x.json"]


def test_a_file_written_whole_gets_the_mode_a_plain_write_gives_it(tmp_path):
    """Not mkstemp's owner-only mode: a lake day, a landed file or a scored CSV written whole is
    readable by whom the umask lets read it, as if written in place."""
    storage = LocalStorage(base_dir=str(tmp_path / "lake"))
    umask = os.umask(0o027)
    try:
        storage.write_bytes("synthetic/features/2024-01-01/run-0.json", b"{}")
        storage.write_with("synthetic/model/2024-01-01/run-0.joblib", lambda h: h.write(b"m"))
        write_atomically(tmp_path / "scored.csv", b"a,b\n")
        with open(tmp_path / "plain.csv", "wb") as plain:
            plain.write(b"a,b\n")
    finally:
        os.umask(umask)

    modes = {
        path.name: stat.S_IMODE(path.stat().st_mode)
        for path in tmp_path.rglob("*")
        if path.is_file()
    }
    assert modes == {
        "run-0.json": 0o640,
        "run-0.joblib": 0o640,
        "scored.csv": 0o640,
        "plain.csv": 0o640,
    }
