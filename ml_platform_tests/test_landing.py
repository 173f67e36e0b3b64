"""Landing day files: names from the contract, idempotent re-landing, replacement, missing days;
links, folders, FIFOs and names leaving the zone refused without a byte read."""

import datetime as dt
import hashlib
import io
import os
from pathlib import Path

import pandas as pd
import pytest

from ml_platform import cli
from ml_platform.contracts import load_contract
from ml_platform.ingestion.assets import LandingFileError, read_landed_file, read_landed_stream
from ml_platform.ingestion.landing import (
    LandingZone,
    MissingLandingFileError,
    RefusedLandingFileError,
    land_days,
    source_day,
    unsafe_name_reason,
)
from ml_platform.ingestion.synthetic import Drift, generate_day

SYNTHETIC = load_contract("synthetic")
FLIGHTS = load_contract("flights")
DAYS = [dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)]
LONG_AGO_NS = 946_684_800 * 10**9  # 2000-01-01


def names(zone_dir) -> list[str]:
    return sorted(os.listdir(zone_dir))


def test_land_days_writes_files_named_by_the_contract_pattern(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))

    landed = list(land_days(SYNTHETIC, zone, DAYS))

    expected = [f"synthetic_{d.isoformat()}.csv" for d in DAYS]
    assert [(d, p.name, s) for d, p, s in landed] == [
        (d, name, "written") for d, name in zip(DAYS, expected, strict=True)
    ]
    assert names(tmp_path) == expected
    for d, path, _ in landed:
        assert path == tmp_path / f"synthetic_{d.isoformat()}.csv"


def test_a_landed_file_reads_back_as_the_source_rows(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(SYNTHETIC, zone, DAYS[:1]))

    data = zone.read_bytes("synthetic_2024-01-01.csv", "2024-01-01")
    frame = read_landed_file(data, "synthetic_2024-01-01.csv", "2024-01-01")

    source = generate_day(DAYS[0], seed=7, rows=1000)
    assert list(frame.columns) == list(source.columns)
    assert len(frame) == 1000
    assert frame["event_time"].tolist() == source["event_time"].tolist()
    pd.testing.assert_series_equal(frame["target"], source["target"])


class Trickle(io.RawIOBase):
    """A stream that hands out at most `size` bytes per read, as a network body may."""

    def __init__(self, data: bytes, size: int):
        super().__init__()
        self.data = io.BytesIO(data)
        self.size = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data.read(min(len(buffer), self.size))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_a_landed_file_streams_to_the_same_frame_hash_and_size(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(SYNTHETIC, zone, DAYS[:1]))
    name = "synthetic_2024-01-01.csv"
    data = zone.read_bytes(name, "2024-01-01")

    with zone.open_file(name, "2024-01-01") as stream:
        landed = read_landed_stream(stream, name, "2024-01-01", ["segment"])

    assert landed.sha256 == hashlib.sha256(data).hexdigest()
    assert landed.size == len(data)
    expected = read_landed_file(data, name, "2024-01-01", ["segment"])
    pd.testing.assert_frame_equal(landed.frame, expected)


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_the_truncation_check_sees_the_last_line_whatever_the_reads_sizes(size):
    # The first and last lines are taken as the parser reads: a line split across reads, or
    # line breaks arriving alone after it, must read as it does from the whole file.
    cut = b"a,b,c\r\n1,2,3\r\n4,5,6\r\n7,\r\n\r\n"
    with pytest.raises(LandingFileError, match=r"f\.csv \(partition p\).*2 of the header's 3"):
        read_landed_stream(Trickle(cut, size), "f.csv", "p")
    whole = b"a,b,c\n1,2,3\n4,5,\n\n"  # an empty last field is not a cut
    landed = read_landed_stream(Trickle(whole, size), "f.csv", "p")
    assert landed.frame["a"].tolist() == [1, 4]
    assert (landed.sha256, landed.size) == (hashlib.sha256(whole).hexdigest(), len(whole))


def test_opening_a_missing_landed_file_names_file_and_partition(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    with (
        pytest.raises(FileNotFoundError, match="partition 2024-02-01.*synthetic_2024-02-01.csv"),
        zone.open_file("synthetic_2024-02-01.csv", "2024-02-01"),
    ):
        pass


def test_flights_days_are_named_by_their_pattern(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    [(day, path, status)] = land_days(FLIGHTS, zone, [dt.date(2013, 1, 2)])
    assert (day, path.name, status) == (dt.date(2013, 1, 2), "flights_2013-01-02.csv", "written")
    assert names(tmp_path) == ["flights_2013-01-02.csv"]
    frame = read_landed_file(path.read_bytes(), path.name, "2013-01-02")
    assert set(zip(frame["year"], frame["month"], frame["day"], strict=True)) == {(2013, 1, 2)}


def test_landing_again_is_unchanged_and_leaves_files_untouched(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(SYNTHETIC, zone, DAYS))
    before = {}
    for name in names(tmp_path):
        path = tmp_path / name
        os.utime(path, ns=(LONG_AGO_NS, LONG_AGO_NS))
        before[name] = (path.stat().st_mtime_ns, path.stat().st_ino, path.read_bytes())

    statuses = [status for _, _, status in land_days(SYNTHETIC, zone, DAYS)]

    assert statuses == ["unchanged"] * len(DAYS)
    after = {}
    for name in names(tmp_path):
        path = tmp_path / name
        after[name] = (path.stat().st_mtime_ns, path.stat().st_ino, path.read_bytes())
    assert after == before


def test_a_changed_file_is_replaced(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(SYNTHETIC, zone, DAYS))
    old = {d: zone.path_for(f"synthetic_{d}.csv").read_bytes() for d in DAYS}

    landed = list(land_days(SYNTHETIC, zone, DAYS, fault="null_burst", fault_days={DAYS[1]}))

    assert [status for _, _, status in landed] == ["unchanged", "replaced", "unchanged"]
    new = zone.path_for("synthetic_2024-01-02.csv").read_bytes()
    assert new != old[DAYS[1]]
    expected = generate_day(DAYS[1], seed=7, rows=1000, fault="null_burst")
    assert new == expected.to_csv(index=False).encode()
    assert zone.path_for("synthetic_2024-01-01.csv").read_bytes() == old[DAYS[0]]
    assert names(tmp_path) == [f"synthetic_{d.isoformat()}.csv" for d in DAYS]


def test_drift_relands_only_the_days_from_its_start(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(SYNTHETIC, zone, DAYS))
    drift = Drift(feature="x2", shift_sd=1.0, start=DAYS[2])

    statuses = [status for _, _, status in land_days(SYNTHETIC, zone, DAYS, drift=drift)]

    assert statuses == ["unchanged", "unchanged", "replaced"]


def test_progress_reports_each_day(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    messages: list[str] = []
    list(land_days(SYNTHETIC, zone, DAYS[:2], progress=messages.append))
    assert len(messages) == 2
    assert "2024-01-01" in messages[0]
    assert "synthetic_2024-01-01.csv" in messages[0]
    assert "1000 rows written" in messages[0]
    assert messages[1].startswith("[2/2]")


def test_reading_a_day_that_never_landed_names_the_path_and_partition(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path))
    list(land_days(SYNTHETIC, zone, DAYS[:1]))

    with pytest.raises(MissingLandingFileError) as info:
        zone.read_bytes("synthetic_2024-02-01.csv", "2024-02-01")

    message = str(info.value)
    assert str(tmp_path / "synthetic_2024-02-01.csv") in message
    assert "partition 2024-02-01" in message
    assert isinstance(info.value, FileNotFoundError)


def test_no_temporary_files_are_left_behind(tmp_path):
    zone = LandingZone(base_dir=str(tmp_path / "landing"))
    list(land_days(SYNTHETIC, zone, DAYS))
    list(land_days(SYNTHETIC, zone, DAYS, fault="duplicate_rows"))
    list(land_days(SYNTHETIC, zone, DAYS))

    assert names(tmp_path / "landing") == [f"synthetic_{d.isoformat()}.csv" for d in DAYS]


def test_drift_and_faults_are_refused_for_flights():
    with pytest.raises(ValueError, match="synthetic dataset only"):
        source_day(FLIGHTS, dt.date(2013, 1, 1), fault="null_burst")


def zone_with_links(tmp_path):
    """A zone holding a day file, links (out of the zone and into it), a folder and a FIFO."""
    zone_dir = tmp_path / "landing"
    zone_dir.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.csv").write_bytes(b"password,hunter2\n1,2\n")
    (zone_dir / "synthetic_2024-01-01.csv").write_bytes(b"a,b\n1,2\n")
    (zone_dir / "synthetic_2024-01-02.csv").symlink_to("/etc/os-release")
    (zone_dir / "synthetic_2024-01-03.csv").symlink_to(outside / "secret.csv")
    (zone_dir / "synthetic_2024-01-04.csv").symlink_to(zone_dir / "synthetic_2024-01-01.csv")
    (zone_dir / "synthetic_2024-01-05.csv").mkdir()
    os.mkfifo(zone_dir / "synthetic_2024-01-06.csv")
    return LandingZone(base_dir=str(zone_dir))


def test_links_folders_and_fifos_are_listed_as_refused_with_the_reason(tmp_path):
    zone = zone_with_links(tmp_path)

    entries = {entry.name: entry.refused for entry in zone.entries()}

    assert entries.pop("synthetic_2024-01-01.csv") is None
    for day in ["02", "03", "04"]:  # out of the zone, or into it: never followed
        assert "symbolic link" in entries.pop(f"synthetic_2024-01-{day}.csv")
    assert "directory" in entries.pop("synthetic_2024-01-05.csv")
    assert "not a regular file" in entries.pop("synthetic_2024-01-06.csv")
    assert entries == {}


def test_opening_a_refused_entry_names_file_partition_and_reason_and_reads_nothing(tmp_path):
    zone = zone_with_links(tmp_path)
    secrets = [Path("/etc/os-release").read_text().splitlines()[0], "password,hunter2"]
    reasons = {"02": "symbolic link", "03": "symbolic link", "04": "symbolic link"}
    reasons |= {"05": "directory", "06": "not a regular file"}  # a FIFO: must not block

    for day, reason in reasons.items():
        name, partition = f"synthetic_2024-01-{day}.csv", f"2024-01-{day}"
        with pytest.raises(RefusedLandingFileError) as info, zone.open_file(name, partition):
            pass
        message = str(info.value)
        assert str(zone.path_for(name)) in message and f"partition {partition}" in message
        assert reason in message
        assert not [secret for secret in secrets if secret in message]
    with zone.open_file("synthetic_2024-01-01.csv", "2024-01-01") as stream:
        assert stream.read() == b"a,b\n1,2\n"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../elsewhere/secret.csv", "'..' segment"),
        ("sub/../../secret.csv", "'..' segment"),
        ("./synthetic_2024-01-01.csv", "'.' or '..' segment"),
        ("/etc/os-release", "absolute path"),
        ("C:\\secret.csv", "absolute path"),
        ("synthetic_2024-01-01.csv\n", "control character"),
    ],
)
def test_names_that_could_leave_the_zone_are_refused_before_any_read(tmp_path, name, reason):
    zone_with_links(tmp_path)
    zone = LandingZone(base_dir=str(tmp_path / "landing"))
    assert reason in (unsafe_name_reason(name) or "")
    with (
        pytest.raises(RefusedLandingFileError, match="partition 2024-01-01.*refused"),
        zone.open_file(name, "2024-01-01"),
    ):
        pass
    assert unsafe_name_reason("synthetic_2024-01-01.csv") is None


def test_landing_status_of_a_zone_that_does_not_exist_says_so(tmp_path, capsys):
    # A mistyped path or an unmounted volume is not an empty zone.
    missing = tmp_path / "not_mounted"
    args = ["landing-status", "--dataset", "synthetic", "--landing-dir", str(missing)]
    assert cli.main(args) == 2
    assert f"error: the landing zone {missing} does not exist: create or mount it" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["materialize", "--start", "2024-01-01", "--days", "0"], "must be at least 1, not 0"),
        (["land", "--start", "2024-01-01", "--days", "-2"], "must be at least 1, not -2"),
        (["rejected", "--start", "2024-01-01", "--days", "two"], "not a whole number: 'two'"),
        (["health", "--days", "-3"], "must be above 0, not -3"),
    ],
)
def test_a_count_of_days_that_names_no_day_is_refused_before_anything_runs(command, said, capsys):
    # A script's miscomputed count would otherwise run nothing and exit 0.
    with pytest.raises(SystemExit) as stopped:
        cli.main(command)
    assert stopped.value.code == 2
    assert f"argument --days: {said}" in capsys.readouterr().err


def test_rejected_days_without_a_start_are_the_last_days_asked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("")
    assert cli.main(["rejected", "--dataset", "synthetic", "--days", "3"]) == 0
    assert "synthetic: no rejected day among 3 day(s)" in capsys.readouterr().out
    assert cli.main(["rejected", "--dataset", "synthetic", "--start", "2024-01-01"]) == 0
    assert "synthetic: no rejected day among 1 day(s)" in capsys.readouterr().out
