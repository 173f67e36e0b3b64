"""What a step receives for an upstream asset's partitions: each one loaded when it is read.

A range step's `DailyInput` and a window's `WindowPartitions` load a partition on first access
and keep the latest within a memory budget (`PartitionCache`), so a step holds about one day of
rows whatever its window.
"""

import collections
import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
import pandas as pd

# An input with this metadata (the window's length in days) receives its partitions as a
# mapping (`WindowPartitions`, each partition loaded when read), even when the window holds a
# single partition (the first day), so the asset always sees one type. It holds only the
# window's partitions that are stored: a day rejected by its gates (or not materialised yet) is
# a hole the asset judges (`training.assets.window_coverage`).
WINDOW_KEY = "ml_platform/window"


# In-memory size of the loaded window partitions a step keeps for reuse. A day's model and
# evaluation read their window several times (a counting pass, the preprocessing's statistics,
# the held-out rows): a window of small days (a flights day is 0.2 MB) is read once, a window of
# big days (a 1M-row synthetic day is 100 MB) keeps one day at a time, so a step's memory does
# not grow with its window.
WINDOW_CACHE_BYTES = 64 * 1024 * 1024


def value_bytes(value: Any) -> float:
    """In-memory size of a loaded partition: a frame's, else unknown (infinite)."""
    if isinstance(value, pd.DataFrame):
        return float(value.memory_usage(deep=True).sum())
    return float("inf")


@dataclasses.dataclass
class LoadedPartition:
    """A partition as loaded, and what was computed from that load (`PartitionCache.derived`)."""

    value: Any
    size: float
    derived: dict[Hashable, Any] = dataclasses.field(default_factory=dict)


class PartitionCache:
    """Partitions loaded on request; the latest kept while they fit `max_bytes`, the last always.

    `rows[key]` remembers the rows of every frame loaded, for the step's `rows_in` metadata.
    """

    def __init__(self, load: Callable[[str], Any], max_bytes: float = WINDOW_CACHE_BYTES):
        self.load = load
        self.max_bytes = max_bytes
        self.kept: collections.OrderedDict[str, LoadedPartition] = collections.OrderedDict()
        self.rows: dict[str, int] = {}

    def get(self, key: str) -> Any:
        """The partition, loaded now unless it is kept."""
        return self._entry(key).value

    def value_and_size(self, key: str) -> tuple[Any, float]:
        """The partition and its in-memory size, measured when it was loaded (inf: unknown)."""
        entry = self._entry(key)
        return entry.value, entry.size

    def derived(self, key: str, name: Hashable, compute: Callable[[Any], Any]) -> Any:
        """`compute(partition)`, computed once for each load of the partition.

        A range step's days read the same window partitions: a partition's hash or label counts
        are computed once while it is kept. They live and go with the loaded value, so they are
        always those of the rows the step reads: a partition evicted and rewritten (by another
        run, a re-landed file) is loaded again and its values computed again.
        """
        entry = self._entry(key)
        if name not in entry.derived:
            entry.derived[name] = compute(entry.value)
        return entry.derived[name]

    def _entry(self, key: str) -> LoadedPartition:
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        value = self.load(key)
        if isinstance(value, pd.DataFrame):
            self.rows[key] = len(value)
        # A cache that keeps only the last partition needs no size: measuring a frame of
        # strings costs about a millisecond a load.
        size = value_bytes(value) if self.max_bytes > 0 else math.inf
        entry = self.kept[key] = LoadedPartition(value, size)
        while len(self.kept) > 1 and sum(e.size for e in self.kept.values()) > self.max_bytes:
            self.kept.popitem(last=False)
        return entry


class WindowPartitions(Mapping[str, Any]):
    """A window input: its stored partitions by key, each loaded when it is read.

    What a model or evaluation step receives for its feature window. Only stored partitions are
    keys (a hole is left out); reading one loads it from the lake unless the cache still holds
    it, so a step that reads its window a day at a time holds about one day (`PartitionCache`).
    """

    def __init__(self, keys: Sequence[str], cache: PartitionCache):
        self.keys_ = sorted(keys)
        self.cache = cache

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys_:
            raise KeyError(key)
        return self.cache.get(key)

    def derived(self, key: str, name: Hashable, compute: Callable[[Any], Any]) -> Any:
        """`compute` of partition `key`, once for each load of it (`PartitionCache.derived`)."""
        if key not in self.keys_:
            raise KeyError(key)
        return self.cache.derived(key, name, compute)

    def value_and_size(self, key: str) -> tuple[Any, float]:
        """Partition `key` and its in-memory size (`value_bytes`), measured once a load."""
        if key not in self.keys_:
            raise KeyError(key)
        return self.cache.value_and_size(key)

    def __contains__(self, key: object) -> bool:
        # Mapping's own asks for the value, which would load the partition.
        return key in self.keys_

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)

    @property
    def rows_read(self) -> int:
        """Rows of the partitions read so far (each counted once)."""
        return sum(self.cache.rows.get(key, 0) for key in self.keys_)


class DailyInput(WindowPartitions):
    """An upstream asset's partitions for a range step, each loaded when a day first asks for it.

    `for_day(day)` is what a one-day step would have received: the day's value, or for a window
    input (`window_days`) the `WindowPartitions` of the window's partitions ending that day (of
    a window input, `keys` are only the stored partitions, so a hole is left out as in a one-day
    step). Loaded window partitions are kept within `WINDOW_CACHE_BYTES`, so a sliding window of
    small days reads each partition once; other inputs keep the last partition loaded.
    """

    def __init__(
        self,
        keys: Sequence[str],
        load: Callable[[str], Any],
        window_days: int | None = None,
        asset_key: dg.AssetKey | None = None,
    ):
        super().__init__(keys, PartitionCache(load, WINDOW_CACHE_BYTES if window_days else 0))
        self.window_days = window_days
        # The upstream asset, whose record of a missing day says whether it was rejected.
        self.asset_key = asset_key

    def for_day(self, day: str) -> Any:
        """The value a one-day step of `day` gets for this input."""
        if self.window_days is None:
            return self[day]
        first = (dt.date.fromisoformat(day) - dt.timedelta(days=self.window_days - 1)).isoformat()
        return WindowPartitions([key for key in self.keys_ if first <= key <= day], self.cache)
