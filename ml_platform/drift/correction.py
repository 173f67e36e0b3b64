"""Multiple-testing corrections of one day's p-values, as adjusted p-values.

A feature passes the p-value gate when its adjusted p-value is at most `alpha`, which is the
same decision as the step-down (Holm) or step-up (Benjamini-Hochberg) procedure at `alpha`.
"""

import numpy as np


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm's adjusted p-values: controls the chance that a day raises any false alarm."""
    p = np.asarray(pvalues, dtype="float64")
    m = len(p)
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return adjusted


def benjamini_hochberg(pvalues: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values: controls the share of false alarms among alarms."""
    p = np.asarray(pvalues, dtype="float64")
    m = len(p)
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = m * p[order] / np.arange(1, m + 1)
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    return adjusted


CORRECTIONS = {"holm": holm, "benjamini_hochberg": benjamini_hochberg}
