"""Seconds per tick of the landing sensor over a zone of 10,000 daily files.

Run: .venv/bin/python benchmarks/sensor_tick.py [--files 10000] [--steady-ticks 5] [--s3]

The synthetic contract, its first day moved back so that every file's day is a partition
(10,000 days reach back to 1999), the real code location (`build_definitions`), a real
Dagster instance (SQLite under a temporary DAGSTER_HOME) and a landing zone of `--files` real
files of the contract's pattern (a local directory, or with `--s3` a prefix on moto's S3
server on 127.0.0.1). Each tick is `SensorDefinition.evaluate_tick`, which is what the daemon's
code server runs, with the cursor carried from tick to tick as the daemon carries it:

- first walk: the ticks that find all the files new (the run requests each tick emits);
- steady state: ticks over the same files, nothing changed;
- one new file: a file for the next day lands; ticks until it is requested.

Prints one JSON object (per-tick seconds, requests, files listed) and a Markdown table.
"""

import argparse
import datetime as dt
import json
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from ml_platform.automation.landing_sensor import (
    LANDING_SENSOR,
    MAX_REQUESTS_PER_TICK,
    PAGE_SIZE,
    PAGES_PER_TICK,
)
from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import bundled_contracts
from ml_platform.definitions import build_definitions
from ml_platform.platform.datasets import dataset_name

FILE_BYTES = b"event_time,x1\n2024-01-01T00:00:00,0.5\n"
BUCKET = "landing-bench"


# The dataset of the benchmark's contract, whose landing sensor is ticked.
SENSED = "synthetic"


def long_contract(directory: Path, first_day: dt.date) -> Contract:
    """The synthetic contract starting at `first_day`, so that every file is a partition."""
    document = yaml.safe_load(bundled_contracts()["synthetic"].read_text())
    document["partitions"]["start_date"] = first_day.isoformat()
    document["drift"]["reference"]["start"] = first_day.isoformat()
    path = directory / "synthetic_bench.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_contract(path)


def file_names(contract: Contract, days: list[dt.date]) -> list[str]:
    return [contract.landing.file_name(d.isoformat()) for d in days]


def seed_directory(directory: Path, names: list[str], age_seconds: float) -> None:
    stamp = time.time() - age_seconds
    for name in names:
        path = directory / name
        path.write_bytes(FILE_BYTES)
        os.utime(path, (stamp, stamp))


def serve_s3(names: list[str], age_seconds: float, port: Any, stop: Any) -> None:
    """A moto S3 server holding the zone's objects; runs in its own process.

    Its own process, so that the server's work (moto sorts and serialises the whole bucket
    for every page) shows in the wall time like a real S3's latency, not in the sensor's CPU.
    """
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # Straight into the server's store: 10,000 PUTs over HTTP take minutes. Every listing the
    # sensor makes still goes through the S3 API over HTTP.
    backend = s3_backends["123456789012"]["aws"]
    backend.create_bucket(BUCKET, "us-east-1")
    stamp = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=age_seconds)
    for name in names:
        backend.put_object(BUCKET, f"incoming/{name}", FILE_BYTES).last_modified = stamp
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port.value = server.get_host_and_port()[1]
    stop.wait()
    server.stop()


def land(contract: Contract, directory: Path, s3_endpoint: str | None, day: dt.date) -> None:
    """One file landing now, as upstream delivers it."""
    name = contract.landing.file_name(day.isoformat())
    if s3_endpoint is None:
        (directory / name).write_bytes(FILE_BYTES)
        return
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.put_object(Bucket=BUCKET, Key=f"incoming/{name}", Body=FILE_BYTES)


class Ticker:
    """The landing sensor evaluated tick by tick on one instance, cursor carried along."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance):
        self.repository = defs.get_repository_def()
        self.sensor_name = dataset_name(SENSED, LANDING_SENSOR)
        self.sensor = self.repository.get_sensor_def(self.sensor_name)
        self.resources = {
            key: self.repository.get_top_level_resources()[key]
            for key in self.sensor.required_resource_keys
        }
        self.instance = instance
        self.cursor: str | None = None
        self.ticks: list[dict[str, Any]] = []

    def tick(self, phase: str) -> dict[str, Any]:
        """One evaluation, set up as the code server's `get_external_sensor_execution` does."""
        wall, cpu = time.perf_counter(), time.process_time()
        with dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            repository_def=self.repository,
            sensor_name=self.sensor_name,
            resources=self.resources,
        ) as context:
            data = self.sensor.evaluate_tick(context)
        record = {
            "phase": phase,
            "seconds": time.perf_counter() - wall,
            "cpu_seconds": time.process_time() - cpu,
            "requests": len(data.run_requests or []),
            "partitions": [r.partition_key for r in data.run_requests or []],
            "cursor_chars": len(data.cursor or ""),
        }
        self.cursor = data.cursor
        self.ticks.append(record)
        return record

    def until(self, phase: str, done: Callable[[dict[str, Any]], bool], limit: int) -> None:
        for _ in range(limit):
            if done(self.tick(phase)):
                return
        raise RuntimeError(f"{phase}: not done after {limit} ticks")


def walk_complete(ticker: Ticker) -> bool:
    return json.loads(ticker.cursor or "{}").get("walk", "") is None


def run(
    args: argparse.Namespace, home: Path, contract: Contract, days: list[dt.date], s3: str | None
) -> dict[str, Any]:
    landing_dir = home / "landing"
    if s3 is None:
        seed_directory(landing_dir, file_names(contract, days), args.age)
    else:
        os.environ["ML_PLATFORM_LANDING_URL"] = f"s3://{BUCKET}/incoming"
        os.environ["ML_PLATFORM_S3_ENDPOINT_URL"] = s3
    defs = build_definitions(
        contract, landing_dir=None if s3 else str(landing_dir), lake_dir=str(home / "lake")
    )
    new_day = days[-1] + dt.timedelta(days=1)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        ticker = Ticker(defs, instance)
        while not ticker.ticks or not walk_complete(ticker):
            ticker.tick("first walk")
        requested = [p for t in ticker.ticks for p in t["partitions"]]
        assert requested == [d.isoformat() for d in days], "first walk missed files"
        for _ in range(args.steady_ticks):
            ticker.tick("steady state")
        assert not any(t["requests"] for t in ticker.ticks if t["phase"] == "steady state")
        land(contract, landing_dir, s3, new_day)
        ticker.until(
            "one new file",
            lambda t: t["partitions"] == [new_day.isoformat()],
            limit=args.files // (PAGE_SIZE * PAGES_PER_TICK) + 2,
        )
    for t in ticker.ticks:
        del t["partitions"]
    return {
        "zone": "s3 (moto on 127.0.0.1, own process)" if s3 else "local directory",
        "files": args.files,
        "landed_seconds_ago": args.age,
        "page_size": PAGE_SIZE,
        "pages_per_tick": PAGES_PER_TICK,
        "max_requests_per_tick": MAX_REQUESTS_PER_TICK,
        "ticks": ticker.ticks,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| phase | ticks | run requests per tick | median s/tick | max s/tick | CPU s/tick |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for phase in ["first walk", "steady state", "one new file"]:
        ticks = [t for t in result["ticks"] if t["phase"] == phase]
        seconds = [t["seconds"] for t in ticks]
        requests = ", ".join(str(t["requests"]) for t in ticks)
        lines.append(
            f"| {phase} | {len(ticks)} | {requests} | {statistics.median(seconds):.2f} | "
            f"{max(seconds):.2f} | {statistics.median(t['cpu_seconds'] for t in ticks):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--steady-ticks", type=int, default=5)
    parser.add_argument(
        "--age",
        type=float,
        default=86_400.0,
        help="seconds since the files landed; under the sensor's 300 s slack its cursor "
        "remembers every file by name",
    )
    parser.add_argument("--s3", action="store_true", help="an S3 prefix on moto, not a directory")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    # The newest partition is yesterday: the files end the day before, for the new file.
    yesterday = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
    first = yesterday - dt.timedelta(days=args.files)
    days = [first + dt.timedelta(days=i) for i in range(args.files)]
    with tempfile.TemporaryDirectory(prefix="sensor-bench-") as tmp:
        home = Path(tmp)
        (home / "landing").mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        contract = long_contract(home, first)
        if not args.s3:
            result = run(args, home, contract, days, None)
        else:
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
            port, stop = multiprocessing.Value("i", 0), multiprocessing.Event()
            names = file_names(contract, days)
            server = multiprocessing.Process(target=serve_s3, args=(names, args.age, port, stop))
            server.start()
            try:
                while not port.value:
                    time.sleep(0.1)
                result = run(args, home, contract, days, f"http://127.0.0.1:{port.value}")
            finally:
                stop.set()
                server.join()
    result["load_average"] = {"start": round(load, 2), "end": round(os.getloadavg()[0], 2)}
    result["command"] = " ".join(sys.argv)
    print(json.dumps(result))
    print()
    print(table(result))


if __name__ == "__main__":
    main()
