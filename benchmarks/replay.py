"""A replay of real flights days with another estimator, beside the live chain of the same days.

Run: .venv/bin/python benchmarks/replay.py [--days 90] [--start 2013-01-01]
     [--estimator hist_gradient_boosting]

Lands the days, starts a code server, `dagster-webserver` and `dagster-daemon` on a fresh instance
(the repository's dagster.yaml; the webserver and daemon load the code location from the one
code server, as `dg dev` and the production recipe run them), runs the live chain (the bundled
flights contract, sgd) over the days as a backfill through the webserver's GraphQL API, as the
UI's "Materialize" of a range, then `ml-platform replay` of the same contract with
`model: {estimator: ESTIMATOR}` over the same days. Reports each chain's promotions, rejected
days and mean next-day metric of the serving champion (from the replay's comparison), the paired
difference, and the replay's wall time (command start to exit) against the live backfill's.
"""

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import idle
from backfill_year import Stack, fresh_instance, land

from ml_platform.automation.launch import BACKFILL_DONE, Webserver
from ml_platform.platform.rejected import DAY_ASSETS

REPO = Path(__file__).resolve().parents[1]
SUMMARY = ("promotions", "rejected", "mean_metric", "scored")
MODEL = "model:\n  estimator: sgd\n  max_epochs: 30\n  patience: 5\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=dt.date.fromisoformat, default=dt.date(2013, 1, 1))
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--estimator", default="hist_gradient_boosting")
    parser.add_argument("--keep", action="store_true", help="keep the instance, lake and logs")
    idle.add_argument(parser)
    args = parser.parse_args()
    started_load = idle.before(args.loaded)
    root = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    env = fresh_instance(root)
    contracts, replays = root / "contracts", root / "replays"
    contracts.mkdir()
    text = (REPO / "ml_platform" / "contracts" / "flights.yaml").read_text()
    if MODEL not in text:
        raise RuntimeError("the flights contract's model section changed: update this benchmark")
    (contracts / "flights.yaml").write_text(text)
    changed = root / f"flights_{args.estimator}.yaml"
    changed.write_text(text.replace(MODEL, f"model:\n  estimator: {args.estimator}\n"))
    stack = Stack(root, env)
    env |= {
        "ML_PLATFORM_CONTRACTS": str(contracts),
        "ML_PLATFORM_REPLAYS_DIR": str(replays),
        "ML_PLATFORM_DAGSTER_URL": f"http://127.0.0.1:{stack.port}",
    }
    env.pop("ML_PLATFORM_DATASET", None)
    land(root / "landing", args.start, args.days)
    stack.start(code_server=True)
    last = (args.start + dt.timedelta(days=args.days - 1)).isoformat()
    try:
        stack.wait(lambda: stack.graphql("{ version }", {}), 180, "the webserver")
        webserver = Webserver(env["ML_PLATFORM_DAGSTER_URL"])
        started = time.monotonic()
        days = [(args.start.isoformat(), last)]
        backfill_id = webserver.backfill({dg.AssetKey(["flights", n]): days for n in DAY_ASSETS})

        def live_done() -> str | None:
            status = webserver.backfill_status(backfill_id)
            return status if status in BACKFILL_DONE else None

        live_status = stack.wait(live_done, 7200, "the live backfill", interval=5.0)
        live_seconds = time.monotonic() - started
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "ml_platform.cli", "replay", str(changed)]
            + ["--start", args.start.isoformat(), "--days", str(args.days), "--name", "bench"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        replay_seconds = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"the replay failed:\n{done.stdout}\n{done.stderr}")
        path = done.stdout.split("the whole comparison: ", 1)[1].split(" (in the UI", 1)[0]
        comparison = json.loads(Path(path).read_text())
    finally:
        stack.stop()
    summary = comparison["summary"]
    result = {
        "days": args.days,
        "start": args.start.isoformat(),
        "replay_estimator": args.estimator,
        "live_status": live_status,
        "live_seconds": round(live_seconds, 1),
        "replay_seconds": round(replay_seconds, 1),
        "replay_over_live": round(replay_seconds / live_seconds, 2),
        "metric": comparison["metric"],
        **{side: {k: summary[side][k] for k in SUMMARY} for side in ("live", "replay")},
        "difference": comparison["difference"],
        "verdict": comparison["verdict"],
        "training_seconds": {side: summary[side]["train_seconds"] for side in ("live", "replay")},
        "machine": f"{platform.machine()}, python {platform.python_version()}",
        **idle.after(started_load),
    }
    print(json.dumps(result, indent=2))
    if args.keep:
        print(f"kept: {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
