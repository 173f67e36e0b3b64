"""Which days a day is compared with: the reference of the drift check and the history gate.

The reference is always made of days before day D, so a day is never compared with itself or
with the future, and rerunning the check of an old day gives the answer it gave then.
"""

import datetime as dt

from ml_platform.contracts.model import DriftReferenceSpec

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def reference_days(spec: DriftReferenceSpec, day: dt.date, first_day: dt.date) -> list[dt.date]:
    """The reference days of `day`, oldest first, never before the first partition `first_day`.

    `previous_days`: the `spec.days` days before D, so a lasting change becomes the new
    normal after that many days. `baseline`: the fixed window from `spec.start`, so a lasting
    change keeps firing; days of the window on or after D are left out. `same_weekday` keeps
    only the days that fall on D's weekday, for data with a weekly rhythm.
    """
    if spec.mode == "previous_days":
        window = [day - dt.timedelta(days=back) for back in range(spec.days, 0, -1)]
    elif spec.mode == "baseline":
        if spec.start is None:
            raise ValueError("a baseline reference needs a start day")
        window = [spec.start + dt.timedelta(days=i) for i in range(spec.days)]
    else:
        raise ValueError(f"unknown reference mode '{spec.mode}'")
    days = [d for d in window if first_day <= d < day]
    if spec.same_weekday:
        days = [d for d in days if d.weekday() == day.weekday()]
    return days


def describe_reference(spec: DriftReferenceSpec, day: dt.date) -> str:
    """The reference of `day` in words, e.g. 'the Saturdays among the 28 days before'."""
    if spec.mode == "baseline":
        assert spec.start is not None
        last = spec.start + dt.timedelta(days=spec.days - 1)
        what = f"the baseline {spec.start.isoformat()} to {last.isoformat()}"
    else:
        what = f"the {spec.days} days before"
    if spec.same_weekday:
        return f"the {WEEKDAYS[day.weekday()]}s of {what}"
    return what
