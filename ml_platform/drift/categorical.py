"""How far a categorical feature's distribution moved: Jensen-Shannon distance and chi-square."""

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

# The chi-square approximation needs about five expected rows per cell; rarer categories are
# tested together as one cell instead of inflating the statistic with noise.
MIN_EXPECTED = 5.0


@dataclasses.dataclass(frozen=True)
class CategoricalComparison:
    """Reference vs current distribution of one categorical feature.

    Attributes:
        js_distance: Jensen-Shannon distance (base 2) of the category shares, in [0, 1].
        chi2: chi-square statistic of homogeneity of the 2 x categories count table.
        dof: its degrees of freedom (after pooling rare categories).
        pvalue: p-value of the chi-square test (1.0 when fewer than two cells remain).
        n_reference: non-null reference rows.
        n_current: non-null current rows.
        reference_shares: share of each category in the reference.
        current_shares: share of each category in the current sample.
        pooled: categories tested together as one cell because they are rare.
    """

    js_distance: float
    chi2: float
    dof: int
    pvalue: float
    n_reference: int
    n_current: int
    reference_shares: dict[str, float]
    current_shares: dict[str, float]
    pooled: list[str]

    @property
    def new_categories(self) -> list[str]:
        """Categories seen today and never in the reference."""
        return [c for c in self.current_shares if self.reference_shares.get(c, 0.0) == 0.0]

    def largest_change(self) -> tuple[str, float, float]:
        """The category whose share moved most: (category, reference share, current share)."""
        categories = set(self.reference_shares) | set(self.current_shares)
        category = max(
            sorted(categories),
            key=lambda c: abs(self.current_shares.get(c, 0.0) - self.reference_shares.get(c, 0.0)),
        )
        return (
            category,
            self.reference_shares.get(category, 0.0),
            self.current_shares.get(category, 0.0),
        )


def category_counts(values: pd.Series) -> pd.Series:
    """Rows per category (as text) of a sample, missing values left out."""
    return values.dropna().astype("str").value_counts()


def column_counts(frame: pd.DataFrame, name: str) -> pd.Series:
    """The `category_counts` of a frame's column; none when the frame lacks the column.

    Features stored before the contract declared a feature (added, or renamed) lack its
    column: that day holds no values of it, as a day whose column is all missing.
    """
    return category_counts(frame[name]) if name in frame.columns else pd.Series(dtype="int64")


def _as_dict(counts: pd.Series) -> dict[str, int]:
    return dict(zip(counts.index, counts.to_numpy(dtype="int64").tolist(), strict=True))


def summed_counts(counts: Sequence[pd.Series]) -> pd.Series:
    """The category counts of samples taken together, from each sample's `category_counts`."""
    total: Counter[str] = Counter()
    for one in counts:
        total.update(_as_dict(one))
    return pd.Series(total, dtype="int64")


def compare_categorical(reference: pd.Series, current: pd.Series) -> CategoricalComparison:
    """Compare the category shares of two samples; missing values are left out of both."""
    return compare_counts(category_counts(reference), category_counts(current))


def compare_counts(ref_counts: pd.Series, cur_counts: pd.Series) -> CategoricalComparison:
    """`compare_categorical` of two samples given by their `category_counts`."""
    # scipy.stats takes seconds to import; the code location loads without it.
    from scipy import stats
    from scipy.spatial.distance import jensenshannon

    ref_of, cur_of = _as_dict(ref_counts), _as_dict(cur_counts)
    categories = sorted(set(ref_of) | set(cur_of))
    ref = np.array([ref_of.get(c, 0) for c in categories], dtype="float64")
    cur = np.array([cur_of.get(c, 0) for c in categories], dtype="float64")
    n_ref, n_cur = int(ref.sum()), int(cur.sum())
    if n_ref == 0 or n_cur == 0:
        nan = float("nan")
        return CategoricalComparison(nan, nan, 0, nan, n_ref, n_cur, {}, {}, [])
    js = float(jensenshannon(ref / n_ref, cur / n_cur, base=2))
    total = ref + cur
    expected_min = total * min(n_ref, n_cur) / (n_ref + n_cur)
    rare = expected_min < MIN_EXPECTED
    table = np.vstack([ref[~rare], cur[~rare]])
    if rare.any():
        table = np.column_stack([table, [ref[rare].sum(), cur[rare].sum()]])
    if table.shape[1] < 2:
        chi2, dof, pvalue = 0.0, 0, 1.0
    else:
        # No Yates correction: cells hold at least MIN_EXPECTED rows (bar one pooled cell),
        # and the same test is then used whatever the number of categories.
        result = stats.chi2_contingency(table, correction=False)
        chi2, dof, pvalue = float(result.statistic), int(result.dof), float(result.pvalue)
    return CategoricalComparison(
        js_distance=js,
        chi2=chi2,
        dof=dof,
        pvalue=pvalue,
        n_reference=n_ref,
        n_current=n_cur,
        reference_shares={c: float(v / n_ref) for c, v in zip(categories, ref, strict=True)},
        current_shares={c: float(v / n_cur) for c, v in zip(categories, cur, strict=True)},
        pooled=[c for c, r in zip(categories, rare, strict=True) if r],
    )
