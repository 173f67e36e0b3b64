"""Retry policy of the steps that touch storage or a network.

Transient trouble (a storage or S3 hiccup, a timeout, a lake file mid-replace) usually passes
within seconds, so such steps retry with exponential backoff and jitter: Dagster waits
(2**n - 1) * 2 s before retry n (2 s, 6 s, 14 s), each +/- 2 s so that runs failing together
do not retry in lock-step; about 22 s in all before the step fails for good. Errors that waiting
cannot fix (a failed quality gate, a schema mismatch, a file that has not landed, and storage that
is full, read-only or refuses permission: `storage_errors.PermanentStorageError`) are raised as
`dg.Failure(allow_retries=False)` and fail at once.
"""

import dagster as dg

STORAGE_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3,
    delay=2,
    backoff=dg.Backoff.EXPONENTIAL,
    jitter=dg.Jitter.PLUS_MINUS,
)
