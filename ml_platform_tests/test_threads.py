"""The process's thread pools, found once, limit the native libraries loaded at any point."""

import subprocess
import sys
import textwrap


def test_pools_found_before_scikit_learn_is_imported_still_limit_its_openmp_threads():
    # A fresh interpreter, where the first caller (a report's scoring) may come before any
    # scikit-learn import: the one controller of the process must still see its OpenMP runtime.
    script = textwrap.dedent(
        """
        import json
        from threadpoolctl import threadpool_info
        from ml_platform.platform.threads import thread_pools

        pools = thread_pools()
        assert thread_pools() is pools
        from ml_platform.training.model import openmp_threads

        with openmp_threads(1), pools.limit(limits=1, user_api="blas"):
            inside = threadpool_info()
        print(json.dumps(sorted({(i["user_api"], i["num_threads"]) for i in inside})))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == '[["blas", 1], ["openmp", 1]]'
