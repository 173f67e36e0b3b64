"""The landing zone on its failure paths: links met by `land`, a zone that is not mounted, a file
still being written, names a day cannot be read from, S3 keys below a folder of the zone."""

import datetime as dt
import io
import os
import unicodedata

import pytest
from dagster_aws.s3 import S3Resource

from ml_platform.contracts import load_contract
from ml_platform.contracts.model import LandingSpec
from ml_platform.ingestion.assets import LandingFileError, read_landed_stream
from ml_platform.ingestion.landing import (
    LandedFileChangedError,
    LandingZone,
    LandingZoneMissingError,
    MissingLandingFileError,
    RefusedLandingFileError,
    land_days,
    scan_landing,
)
from ml_platform.ingestion.s3_landing import S3LandingZone
from ml_platform.ingestion.synthetic import file_bytes, generate_day
from ml_platform_tests.services import FAKE_AWS, s3_test_client

SYNTHETIC = load_contract("synthetic")
DAY = dt.date(2024, 1, 1)
NAME = "synthetic_2024-01-01.csv"


def day_bytes() -> bytes:
    return file_bytes(generate_day(DAY, seed=7, rows=1000))


def test_land_replaces_a_link_to_the_same_bytes_instead_of_calling_it_unchanged(tmp_path):
    # raw_data refuses a link: left in place as "unchanged", the day could never be read.
    zone_dir, elsewhere = tmp_path / "landing", tmp_path / "elsewhere"
    zone_dir.mkdir()
    elsewhere.mkdir()
    (elsewhere / NAME).write_bytes(day_bytes())
    (zone_dir / NAME).symlink_to(elsewhere / NAME)
    zone = LandingZone(base_dir=str(zone_dir))

    [(_, path, status)] = land_days(SYNTHETIC, zone, [DAY])

    assert status == "replaced"
    assert not path.is_symlink() and path.read_bytes() == day_bytes()
    assert zone.find(NAME).refused is None
    assert (elsewhere / NAME).read_bytes() == day_bytes()  # what the link pointed at is kept


def test_land_says_replaced_for_a_dangling_link_or_a_fifo_it_replaces(tmp_path):
    # Something was there, and a sensor or a person reading the status should know it.
    zone_dir = tmp_path / "landing"
    zone_dir.mkdir()
    (zone_dir / NAME).symlink_to(tmp_path / "nothing-there")
    os.mkfifo(zone_dir / "synthetic_2024-01-02.csv")
    zone = LandingZone(base_dir=str(zone_dir))

    landed = list(land_days(SYNTHETIC, zone, [DAY, DAY + dt.timedelta(days=1)]))

    assert [status for _, _, status in landed] == ["replaced", "replaced"]
    assert [entry.refused for entry in zone.entries()] == [None, None]


def test_reading_a_day_from_a_zone_that_is_not_mounted_is_no_missing_file(tmp_path):
    # Read as "not landed", every day run while a volume is unmounted would be recorded
    # rejected and its upstream team told to deliver a file that is there all along.
    zone = LandingZone(base_dir=str(tmp_path / "not_mounted"))

    with pytest.raises(LandingZoneMissingError) as info, zone.open_file(NAME, "2024-01-01"):
        pass

    assert not isinstance(info.value, MissingLandingFileError)
    assert f"the landing zone {tmp_path / 'not_mounted'} does not exist" in str(info.value)
    # An OSError: the step's retry policy retries it, as it does for a storage hiccup.
    assert isinstance(info.value, OSError)


def test_a_file_written_in_place_while_it_is_read_is_not_taken_whole(tmp_path):
    # scp, cp and most FTP servers write the final name as the bytes arrive: the rows read so
    # far may end at a line break and pass every check, a day accepted from part of its file.
    zone = LandingZone(base_dir=str(tmp_path))
    path = zone.path_for(NAME)
    whole = day_bytes()
    path.write_bytes(whole[:4096])

    with pytest.raises(LandedFileChangedError) as info, zone.open_file(NAME, "2024-01-01") as s:
        s.read(100)
        with path.open("ab") as writer:  # the upload goes on
            writer.write(whole[4096:])
        s.read()

    message = str(info.value)
    assert f"{path} (partition 2024-01-01) changed while it was read" in message
    # Waiting fixes it: an OSError, which the step's retry policy retries.
    assert isinstance(info.value, OSError)


def test_a_file_replaced_by_a_rename_while_it_is_read_reads_whole(tmp_path):
    # The careful writer's way (a temporary name renamed into the zone) never mixes two files:
    # the open file is the one it was, and reading it is no error.
    zone = LandingZone(base_dir=str(tmp_path))
    path = zone.path_for(NAME)
    path.write_bytes(day_bytes())

    with zone.open_file(NAME, "2024-01-01") as stream:
        head = stream.read(100)
        (tmp_path / ".next.tmp").write_bytes(b"a,b\n1,2\n")
        os.replace(tmp_path / ".next.tmp", path)
        rest = stream.read()

    assert head + rest == day_bytes()


def test_a_file_cut_off_by_its_writer_at_work_is_no_rejected_day(tmp_path):
    # The parse of the part that had arrived fails as "truncated": that verdict would reject
    # the day and alert its upstream team, while the file was only not finished yet.
    zone = LandingZone(base_dir=str(tmp_path))
    path = zone.path_for(NAME)
    whole = day_bytes()
    cut = whole.index(b"\n", 5000) - 10  # in the middle of a row
    path.write_bytes(whole[:cut])

    with pytest.raises(LandedFileChangedError) as info, zone.open_file(NAME, "2024-01-01") as s:
        arrived = s.read()
        with path.open("ab") as writer:
            writer.write(whole[cut:])
        read_landed_stream(io.BytesIO(arrived), NAME, "2024-01-01")

    assert isinstance(info.value.__cause__, LandingFileError)
    assert "looks truncated" in str(info.value.__cause__)


def test_a_misfit_that_names_its_day_is_told_what_is_wrong_with_its_name():
    # "no parsable date" sends a person to a date that is fine, while the day reads as not
    # landed: a Windows export's `.CSV`, a macOS name's accents as separate marks (NFD).
    accented = SYNTHETIC.model_copy(
        update={"landing": LandingSpec(file_pattern="ventes_été_{date}.csv")}
    )
    nfd = unicodedata.normalize("NFD", "ventes_été_2024-01-03.csv")

    windows = ["synthetic_2024-01-01.CSV", "Synthetic_2024-01-02.csv"]
    problems = {
        **scan_landing(SYNTHETIC, windows).problems,
        **scan_landing(accented, [nfd, "ventes_été_2024-01-04.csv"]).problems,
    }

    assert problems == {
        "synthetic_2024-01-01.CSV": (
            "its name differs from synthetic_2024-01-01.csv in letter case or Unicode form "
            "(accents as separate marks, as macOS writes them); names are matched exactly: "
            "rename it synthetic_2024-01-01.csv"
        ),
        "Synthetic_2024-01-02.csv": (
            "its name differs from synthetic_2024-01-02.csv in letter case or Unicode form "
            "(accents as separate marks, as macOS writes them); names are matched exactly: "
            "rename it synthetic_2024-01-02.csv"
        ),
        nfd: (
            "its name differs from ventes_été_2024-01-03.csv in letter case or Unicode form "
            "(accents as separate marks, as macOS writes them); names are matched exactly: "
            "rename it ventes_été_2024-01-03.csv"
        ),
    }


def test_a_day_that_is_no_date_of_the_calendar_is_said_so():
    problems = scan_landing(
        SYNTHETIC,
        ["synthetic_2024-02-30.csv", "synthetic_2023-02-29.csv", "synthetic_20240101.csv"],
    ).problems

    assert problems["synthetic_2024-02-30.csv"].startswith(
        "its name carries no parsable date: 2024-02-30 is no date of the calendar"
    )
    assert problems["synthetic_2023-02-29.csv"].startswith(
        "its name carries no parsable date: 2023-02-29 is no date of the calendar"
    )
    assert problems["synthetic_20240101.csv"] == (
        "its name carries no parsable date: expected synthetic_{date}.csv with the day as "
        "YYYY-MM-DD"
    )
    # A leap year's day is one.
    assert scan_landing(SYNTHETIC, ["synthetic_2024-02-29.csv"]).days == {
        "2024-02-29": "synthetic_2024-02-29.csv"
    }


@pytest.fixture
def s3_landing(s3_server, monkeypatch) -> S3LandingZone:
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    s3_test_client(s3_server).create_bucket(Bucket="deliveries")
    return S3LandingZone(url="s3://deliveries/incoming", s3=S3Resource(endpoint_url=s3_server))


def test_s3_keys_below_a_folder_of_the_zone_are_refused_as_the_local_zone_refuses_folders(
    s3_landing,
):
    # Upstream systems archive what they sent below `incoming/processed/`: read as names of the
    # zone, each said "no parsable date" (its date is fine) and could be opened as a day.
    client = s3_landing.client()
    for key in ["incoming/synthetic_2024-01-02.csv", f"incoming/processed/{NAME}"]:
        client.put_object(Bucket="deliveries", Key=key, Body=b"a,b\n1,2\n")

    entries = {entry.name: entry.refused for entry in s3_landing.entries()}
    nested = f"processed/{NAME}"

    reason = (
        "it is below a folder of the zone ('processed/'): day files are read from the zone "
        "itself, not from its folders"
    )
    assert entries == {"synthetic_2024-01-02.csv": None, nested: reason}
    assert s3_landing.find(nested).refused == reason
    with (
        pytest.raises(RefusedLandingFileError, match=r"incoming/processed/.*2024-01-01.*folder"),
        s3_landing.open_file(nested, "2024-01-01"),
    ):
        pass
