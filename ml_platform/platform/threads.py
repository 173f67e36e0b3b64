"""The process's native thread pools (BLAS, OpenMP), found once and limited around short work."""

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController


@functools.cache
def thread_pools() -> "ThreadpoolController":
    """The process's BLAS and OpenMP thread pools, found once.

    `threadpool_limits` would search the loaded libraries again on every call (about 3 ms, paid
    by each model and evaluation day); the controller searches once, so the libraries must be
    loaded first: scikit-learn's import loads its OpenMP runtime and numpy's and scipy's BLAS.
    """
    import sklearn  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()
