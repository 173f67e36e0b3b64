"""The vectorised KS: statistics equal to scipy's ks_2samp, p-values close to scipy's."""

import numpy as np
import pytest
from scipy import stats

from ml_platform.drift import ks
from ml_platform.drift.ks import ks_2samp_columns, ks_pvalues

RNG = np.random.default_rng(20240101)


def scipy_columns(reference: np.ndarray, current: np.ndarray, method: str = "asymp"):
    """Per-column scipy results, NaN left out as ks_2samp_columns does."""
    results = []
    for j in range(reference.shape[1]):
        x = reference[:, j][~np.isnan(reference[:, j])]
        y = current[:, j][~np.isnan(current[:, j])]
        # scipy divides by zero for one value per side; the statistic is still compared.
        with np.errstate(divide="ignore"):
            results.append(stats.ks_2samp(x, y, method=method))
    return results


def continuous(n: int, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    shifts = np.linspace(0.0, 0.3, k)
    scales = np.linspace(1.0, 1.5, k)
    return RNG.normal(size=(n, k)), RNG.normal(shifts, scales, size=(m, k))


def tied(n: int, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Few distinct values (hours, counts, rounded numbers): most points are ties."""
    levels = RNG.integers(2, 30, k)
    x = np.column_stack([RNG.integers(0, lv, n) for lv in levels]).astype("float64")
    y = np.column_stack([RNG.integers(0, lv + 1, m) for lv in levels]).astype("float64")
    return x, y


def mixed(n: int, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Continuous values with heavy ties at a few points, as in zero-inflated amounts."""
    x, y = continuous(n, m, k)
    x[RNG.random((n, k)) < 0.3] = 0.0
    y[RNG.random((m, k)) < 0.4] = 0.0
    x = np.round(x, 2)
    return x, y


SIZES = [(1, 1), (3, 8), (50, 50), (1000, 7000), (2500, 40_000), (60_000, 60_000), (200_000, 20)]


@pytest.mark.parametrize("make", [continuous, tied, mixed])
@pytest.mark.parametrize(("n", "m"), SIZES)
def test_statistic_equals_scipy(make, n, m):
    x, y = make(n, m, 4)
    result = ks_2samp_columns(x, y)
    for j, expected in enumerate(scipy_columns(x, y)):
        assert abs(result.statistic[j] - expected.statistic) <= 1e-9, (make.__name__, n, m, j)


def test_statistic_equals_scipy_with_missing_values_and_identical_samples():
    x, y = continuous(30_000, 20_000, 3)
    x[RNG.random(x.shape) < 0.1] = np.nan
    y[:, 2] = x[:20_000, 2]  # many values shared between the samples
    result = ks_2samp_columns(x, y)
    for j, expected in enumerate(scipy_columns(x, y)):
        assert abs(result.statistic[j] - expected.statistic) <= 1e-9
    assert result.n_reference.tolist() == [int(np.sum(~np.isnan(x[:, j]))) for j in range(3)]
    same = ks_2samp_columns(x[:, :1], x[:, :1])
    assert same.statistic[0] == 0.0 and same.pvalue[0] == 1.0


def test_a_shift_the_grid_cannot_see_is_found_exactly():
    """All of the gap sits between two grid points: the exact search must find it."""
    x = np.arange(100_000, dtype="float64")[:, None]
    y = x.copy()
    y[50_000 : 50_000 + ks.grid_step(100_000) // 2] += 0.5  # moves points within one grid cell
    result = ks_2samp_columns(x, y)
    expected = stats.ks_2samp(x[:, 0], y[:, 0], method="asymp").statistic
    assert result.statistic[0] == expected > 0


def test_a_column_without_values_on_one_side_is_nan():
    x = np.column_stack([RNG.normal(size=10), np.full(10, np.nan)])
    y = RNG.normal(size=(12, 2))
    result = ks_2samp_columns(x, y)
    assert np.isfinite(result.statistic[0])
    assert np.isnan(result.statistic[1]) and np.isnan(result.pvalue[1])
    assert result.n_reference.tolist() == [10, 0]


def test_columns_must_match():
    with pytest.raises(ValueError, match="the same columns"):
        ks_2samp_columns(np.zeros((3, 2)), np.zeros((3, 3)))


@pytest.mark.parametrize(
    ("n", "m"), [(1000, 28_000), (7000, 7000), (900, 6300), (101, 5000), (20, 10_001)]
)
def test_pvalues_equal_scipy_asymptotic_up_to_its_exact_size(n, m):
    x, y = continuous(n, m, 6)
    result = ks_2samp_columns(x, y)
    for j, expected in enumerate(scipy_columns(x, y)):
        assert result.pvalue[j] == pytest.approx(expected.pvalue, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (5, 7), (28, 1), (100, 100), (10_000, 20)])
def test_pvalues_of_small_samples_equal_scipy_exact(n, m):
    # A side of at most EXACT_PVALUE_MAX_SIDE values: the asymptotic formula is far off there.
    x, y = mixed(n, m, 3)
    result = ks_2samp_columns(x, y)
    for j, expected in enumerate(scipy_columns(x, y, method="exact")):
        assert result.pvalue[j] == pytest.approx(expected.pvalue, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize(("n", "m"), [(30_000, 30_000), (80_000, 50_000)])
def test_pvalues_of_large_samples_are_within_two_percent_of_scipy(n, m):
    # Shifts chosen so p spans 1 down to ~1e-6, where the tail is still worth comparing.
    # Its own generator: the draws, and so the p-values compared, do not depend on which tests
    # ran before it in the process.
    rng = np.random.default_rng(n + m)
    d = np.sqrt((n + m) / (n * m))
    x = rng.normal(size=(n, 6))
    y = rng.normal(np.array([0.0, 0.5, 1.0, 1.5, 2.0, 2.5]) * d * 2.5, 1.0, size=(m, 6))
    result = ks_2samp_columns(x, y)
    for j, expected in enumerate(scipy_columns(x, y)):
        assert result.pvalue[j] == pytest.approx(expected.pvalue, rel=0.02), j
    assert result.pvalue.min() < 1e-4 < result.pvalue.max()


def test_pvalues_of_statistics_and_sizes():
    p = ks_pvalues(np.array([0.0, 1.0, np.nan]), np.array([10, 10, 10]), np.array([10, 10, 10]))
    assert p[0] == 1.0
    expected = stats.ks_2samp(np.zeros(10), np.ones(10), method="asymp").pvalue
    assert p[1] == pytest.approx(expected, abs=1e-12)
    assert np.isnan(p[2])
