"""What each test module costs in CPU seconds: where the suite's length comes from.

Run (as root, from the repository root, after `make env`):
    .venv/bin/python benchmarks/suite_cpu.py [--lanes 2] [--only test_ui.py ...]

`make test` keeps both cores of the CI machine busy from start to end, so its length is the
suite's CPU seconds over the cores, whatever the order the modules run in. This runs each test
module alone (`pytest MODULE`, every marker), `--lanes` modules at a time, each in a cgroup of
its own, and reads the cgroup's CPU seconds at the end: the module's pytest process and every
process it started, servers, daemons, code servers and the run workers they started included,
however they ended. Wall seconds are printed too, but with other lanes beside a module they
say little; the CPU seconds are what add up. Prints a JSON document: each module's CPU and wall
seconds and exit status, longest first, and the total.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CGROUPS = Path("/sys/fs/cgroup")


def cpu_group(name: str) -> Path:
    """A new CPU-accounting cgroup (cgroup v1's cpuacct hierarchy, or v2)."""
    v1 = CGROUPS / "cpuacct"
    group = (v1 if v1.is_dir() else CGROUPS) / name
    group.mkdir()
    return group


def cpu_seconds(group: Path) -> float:
    if (group / "cpuacct.usage").exists():
        return int((group / "cpuacct.usage").read_text()) / 1e9
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def run_module(module: Path, logs: Path, env: dict[str, str]) -> dict:
    group = cpu_group(f"suite-cpu-{os.getpid()}-{module.stem}")
    procs = group / "cgroup.procs"
    started = time.monotonic()
    with (logs / f"{module.stem}.log").open("w") as log:
        # The shell joins the group, then becomes pytest: everything it starts is counted.
        status = subprocess.call(
            ["bash", "-c", f'echo $$ > {procs} && exec "$@"', "pytest"]
            + [str(REPO / ".venv/bin/pytest"), "-q", "-p", "no:cacheprovider", str(module)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wall = time.monotonic() - started
    time.sleep(2)  # processes a test left to end on their own
    result = {"cpu_s": round(cpu_seconds(group), 1), "wall_s": round(wall, 1), "status": status}
    left = procs.read_text().split()
    if left:
        # Their seconds after this are not counted; the group stays for a look at them.
        result["left_running"] = len(left)
    else:
        group.rmdir()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=2, help="modules run at once (default 2)")
    parser.add_argument("--only", nargs="*", help="these modules (file names), not all")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("suite_cpu.py writes cgroups: run it as root")
    modules = sorted((REPO / "ml_platform_tests").glob("test_*.py"))
    if args.only:
        unknown = set(args.only) - {m.name for m in modules}
        if unknown:
            sys.exit(f"no such test module in ml_platform_tests: {', '.join(sorted(unknown))}")
        modules = [m for m in modules if m.name in args.only]
    logs = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    # As `make test` runs them: a DAGSTER_HOME of their own, not the working tree's.
    env = {**os.environ, "DAGSTER_HOME": tempfile.mkdtemp(prefix="suite-cpu-home-")}
    results: dict[str, dict] = {}
    queue = list(modules)
    lock = threading.Lock()

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                module = queue.pop(0)
            result = run_module(module, logs, env)
            with lock:
                results[module.name] = result
            print(module.name, result, file=sys.stderr)

    threads = [threading.Thread(target=lane) for _ in range(args.lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ordered = dict(sorted(results.items(), key=lambda item: -item[1]["cpu_s"]))
    total = round(sum(r["cpu_s"] for r in ordered.values()), 1)
    print(json.dumps({"total_cpu_s": total, "logs": str(logs), "modules": ordered}, indent=1))


if __name__ == "__main__":
    main()
