"""A run launcher that starts each run in a child forked from a warm process.

With Dagster's DefaultRunLauncher every run is a new Python process that imports Dagster,
pandas, scikit-learn, scipy, Great Expectations and the code location before it computes
anything: about 10 s of a one-day run that computes for 2 (docs/benchmarks.md). This launcher
keeps one process per code location that has imported all of it (ml_platform/warm_process.py)
and forks it for each run; the child runs `dagster api execute_run` in-process, so events,
logs, compute logs, statuses and failures are those of any run worker.

It never runs stale code and never does worse than the default. It serves only runs of a code
location that the daemon runs itself (a `python_module`/`python_package` entry of the
workspace) with this daemon's Python; the warm process is restarted when any file of the code
location's package or an installed distribution changed since it imported them; every other
run, and every run the warm process cannot take (not started in time, died, refused to fork),
is launched by the DefaultRunLauncher, as without this launcher.

Configured in dagster.yaml:

    run_launcher:
      module: ml_platform.launcher
      class: ForkingRunLauncher
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

# A run launcher has no public API in Dagster 1.13: the base class, its context and the health
# types live in dagster._core, as for every launcher Dagster ships (docker, k8s, ecs).
from dagster._core.code_pointer import ModuleCodePointer, PackageCodePointer
from dagster._core.launcher.base import (
    CheckRunHealthResult,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._core.remote_origin import ManagedGrpcPythonEnvCodeLocationOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, ConfigurableClassData

from ml_platform import warm_process

# Run tags the launcher writes: which kind of worker runs the run and, for a forked child, the
# process (pid and start time, which together name one process) and the host it runs on.
WORKER_TAG = "ml_platform/run_worker"
PID_TAG = "ml_platform/run_worker_pid"
START_TAG = "ml_platform/run_worker_start"
HOST_TAG = "ml_platform/run_worker_host"
WARM_TAG = "ml_platform/warm_process_pid"
REASON_TAG = "ml_platform/run_worker_reason"
FORKED = "forked"
# A fork answers in milliseconds; a warm process that takes longer is broken.
FORK_TIMEOUT_SECONDS = 30.0
CODE_SERVER = "code_server"
# After a warm process failed to start, how long its code location's runs go straight to the
# default launcher before another warm process is tried.
RETRY_SECONDS = 300.0


class WarmProcessError(Exception):
    """The warm process could not be started, died or refused the run: no child runs it."""


class ForkOutcomeUnknown(Exception):
    """The warm process took the run but did not say which child runs it.

    The run may be running: launching it again could run it twice, so the launch fails.
    """


@dataclass(frozen=True)
class _Target:
    """What a warm process serves: one code location, one Python, one working directory."""

    location_name: str
    executable: str
    module: str
    attribute: str
    working_directory: str | None


class _WarmProcess:
    """One warm process and the launcher's end of its socket pair."""

    def __init__(self, target: _Target, preload: list[str], start_timeout: float):
        self.target = target
        ours, theirs = socket.socketpair()
        command = [
            target.executable,
            warm_process.__file__,
            *("--fd", str(theirs.fileno())),
            *("--module", target.module),
            *("--attribute", target.attribute),
            *("--working-directory", target.working_directory or ""),
            *("--preload", *preload),
        ]
        # The daemon's environment and working directory, as a code server it starts gets them.
        # Same process group as the daemon: stopping the daemon's group stops this too.
        self.process = subprocess.Popen(
            command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL
        )
        theirs.close()
        self.sock = ours
        self.lines = warm_process._Lines(ours)
        try:
            watch = self._read(start_timeout)["watch"]
            self.trees, self.dirs = list(watch["trees"]), list(watch["dirs"])
            # Taken before the warm process imports any of the code (it waits for "go").
            self.fingerprint = warm_process.fingerprint(self.trees, self.dirs)
            self._send({"go": True})
            ready = self._read(start_timeout)
            if not ready.get("ready"):
                raise WarmProcessError(f"the warm process did not start: {ready}")
        except BaseException:
            self.stop()
            raise

    def _send(self, message: Mapping[str, Any]) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as error:
            raise WarmProcessError(f"the warm process is gone: {error}") from error

    def _read(self, timeout: float) -> dict[str, Any]:
        try:
            message = self.lines.read(timeout)
        except (EOFError, OSError) as error:
            raise WarmProcessError(
                f"the warm process exited (code {self.process.poll()})"
            ) from error
        if message is None:
            raise WarmProcessError(f"the warm process did not answer within {timeout:.0f} s")
        if "error" in message:
            raise WarmProcessError(str(message["error"]))
        return message

    def alive(self) -> bool:
        return self.process.poll() is None

    def stale(self) -> bool:
        return warm_process.fingerprint(self.trees, self.dirs) != self.fingerprint

    def fork(self, run_id: str, execute_run_args: str, timeout: float) -> tuple[int, int]:
        """Fork a child that executes the run; its pid and start ticks."""
        self._send({"run_id": run_id, "execute_run_args": execute_run_args})
        try:
            message = self.lines.read(timeout)
        except (EOFError, OSError) as error:
            raise ForkOutcomeUnknown(f"the warm process ended after taking run {run_id}") from error
        if message is not None and "error" in message:
            raise WarmProcessError(str(message["error"]))  # refused before forking
        if message is None or message.get("run_id") != run_id or not message.get("start"):
            raise ForkOutcomeUnknown(f"the warm process answered run {run_id} with {message}")
        return int(message["pid"]), int(message["start"])

    def stop(self) -> None:
        """End the warm process; the runs forked from it go on.

        Closing the socket ends it. Not SIGTERM: it passes that on to its runs. SIGKILL only
        for one that does not read the socket within 10 s (still importing, or hung).
        """
        self.sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _target_of(run: dg.DagsterRun) -> tuple[_Target | None, str]:
    """The warm process a run can be forked from, or None and why it cannot."""
    origin = run.job_code_origin
    remote = run.remote_job_origin
    if origin is None or remote is None:
        return None, "the run has no code origin"
    location = remote.repository_origin.code_location_origin
    if not isinstance(location, ManagedGrpcPythonEnvCodeLocationOrigin):
        # A code server the daemon does not run (another host, container or image): its code
        # is not the code on this disk.
        return None, f"code location {location.location_name} is not run by this daemon"
    repository = origin.repository_origin
    if repository.executable_path != sys.executable:
        return None, f"the code location runs {repository.executable_path}, not {sys.executable}"
    if repository.container_image or repository.container_context:
        return None, "the code location names a container"
    if repository.entry_point not in (None, ["dagster"], ("dagster",)):
        return None, f"the code location's entry point is {repository.entry_point}"
    pointer = repository.code_pointer
    if isinstance(pointer, ModuleCodePointer):
        attribute = pointer.fn_name
    elif isinstance(pointer, PackageCodePointer):
        attribute = pointer.attribute
    else:
        return None, f"code pointer {type(pointer).__name__} is not a module"
    target = _Target(
        location_name=location.location_name,
        executable=repository.executable_path,
        module=pointer.module,
        attribute=attribute,
        working_directory=pointer.working_directory,
    )
    return target, ""


def _worker_alive(tags: Mapping[str, str]) -> bool:
    pid, start = int(tags[PID_TAG]), int(tags[START_TAG])
    return warm_process.process_start_ticks(pid) == start


class ForkingRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a child forked from a warm process of its code location.

    Falls back to Dagster's DefaultRunLauncher for any run it cannot fork (see the module's
    docstring); `terminate` and run monitoring work for both kinds.
    """

    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        start_timeout_seconds: float = 120.0,
        terminate_grace_seconds: float = 30.0,
        preload_modules: list[str] | None = None,
    ):
        self._inst_data = inst_data
        self._start_timeout = start_timeout_seconds
        self._terminate_grace = terminate_grace_seconds
        self._preload = list(preload_modules or warm_process.DEFAULT_PRELOAD)
        self._fallback = dg.DefaultRunLauncher()
        self._warm: dict[_Target, _WarmProcess] = {}
        # When a warm process of a target last failed to start: until RETRY_SECONDS later its
        # runs go straight to the default launcher instead of each waiting for another failure.
        self._failed: dict[_Target, tuple[float, str]] = {}
        # launch_run may be called from several threads of the daemon; one request at a time
        # goes to a warm process.
        self._lock = threading.Lock()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        """The dagster.yaml entry this launcher was built from."""
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        """The `config:` keys the launcher accepts in dagster.yaml (all optional)."""
        return {
            # How long a new warm process may take to import everything before the run is
            # launched the default way instead.
            "start_timeout_seconds": dg.Field(float, is_required=False, default_value=120.0),
            # How long a terminated run may take to stop after SIGTERM before its process
            # group is killed.
            "terminate_grace_seconds": dg.Field(float, is_required=False, default_value=30.0),
            "preload_modules": dg.Field([str], is_required=False),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> "ForkingRunLauncher":
        """The launcher of a dagster.yaml entry."""
        return cls(inst_data=inst_data, **config_value)

    def register_instance(self, instance) -> None:
        """Attach the instance, to this launcher and to the default one it falls back to."""
        super().register_instance(instance)
        self._fallback.register_instance(instance)

    def launch_run(self, context: LaunchRunContext) -> None:
        """Fork the run from its code location's warm process, or launch it the default way."""
        run = context.dagster_run
        target, reason = _target_of(run)
        if target is not None:
            try:
                self._fork(run, target)
                return
            except WarmProcessError as error:
                reason = str(error)
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: CODE_SERVER, REASON_TAG: reason[:500]})
        self._instance.report_engine_event(
            f"Launching the run through the code server (the DefaultRunLauncher): {reason}",
            run,
            cls=self.__class__,
        )
        self._fallback.launch_run(context)

    def _fork(self, run: dg.DagsterRun, target: _Target) -> None:
        args = ExecuteRunArgs(
            job_origin=run.job_code_origin,  # type: ignore[arg-type]  # checked by _target_of
            run_id=run.run_id,
            instance_ref=self._instance.get_ref(),
        )
        with self._lock:
            warm = self._warm_process(target)
            try:
                pid, start = warm.fork(run.run_id, dg.serialize_value(args), FORK_TIMEOUT_SECONDS)
            except (WarmProcessError, ForkOutcomeUnknown):
                self._warm.pop(target).stop()
                raise
        self._instance.add_run_tags(
            run.run_id,
            {
                WORKER_TAG: FORKED,
                PID_TAG: str(pid),
                START_TAG: str(start),
                HOST_TAG: socket.gethostname(),
                WARM_TAG: str(warm.process.pid),
            },
        )

    def _warm_process(self, target: _Target) -> _WarmProcess:
        """A live warm process of `target` that has imported the code on disk now."""
        warm = self._warm.get(target)
        if warm is not None and (not warm.alive() or warm.stale()):
            warm.stop()
            del self._warm[target]
            warm = None
        if warm is None:
            failed_at, error = self._failed.get(target, (-RETRY_SECONDS, ""))
            if time.monotonic() - failed_at < RETRY_SECONDS:
                raise WarmProcessError(f"{error} (at most one attempt every {RETRY_SECONDS:.0f} s)")
            try:
                warm = _WarmProcess(target, self._preload, self._start_timeout)
            except WarmProcessError as failure:
                self._failed[target] = (time.monotonic(), str(failure))
                raise
            self._failed.pop(target, None)
            self._warm[target] = warm
        return warm

    @property
    def supports_check_run_worker_health(self) -> bool:
        """Run monitoring may ask whether a run's worker still lives."""
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        """Whether the forked worker of a started run still lives (pid and start time)."""
        tags = run.tags
        if tags.get(WORKER_TAG) != FORKED or PID_TAG not in tags:
            # A run of the code server: its gRPC server marks the run failed when its process
            # dies, as with the DefaultRunLauncher alone.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "run worker of the code server")
        if tags.get(HOST_TAG) != socket.gethostname():
            return CheckRunHealthResult(
                WorkerStatus.UNKNOWN, f"run worker on host {tags.get(HOST_TAG)}, not this one"
            )
        if _worker_alive(tags):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=tags[PID_TAG])
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"the run worker process {tags[PID_TAG]} exited without finishing the run",
            run_worker_id=tags[PID_TAG],
        )

    def terminate(self, run_id: str) -> bool:
        """Interrupt the run's worker (its process group), killing it after a grace period."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        tags = run.tags
        if tags.get(WORKER_TAG) != FORKED or PID_TAG not in tags:
            return self._fallback.terminate(run_id)
        self._instance.report_run_canceling(run)
        if tags.get(HOST_TAG) != socket.gethostname():
            self._instance.report_engine_event(
                f"Unable to terminate the run: its worker runs on host {tags.get(HOST_TAG)}.",
                run,
                cls=self.__class__,
            )
            return False
        pid = int(tags[PID_TAG])
        if not _worker_alive(tags):
            self._instance.report_run_canceled(run, f"The run worker {pid} had already exited.")
            return True
        # SIGTERM is the interrupt `dagster api execute_run` turns into a cancelled run (steps
        # fail as interrupted, the run ends CANCELED), as the code server's cancel request does.
        with contextlib.suppress(ProcessLookupError):  # it may end on its own meanwhile
            os.killpg(pid, signal.SIGTERM)
        threading.Thread(
            target=self._kill_after_grace,
            args=(run_id, dict(tags)),
            name=f"terminate-{run_id}",
            daemon=True,
        ).start()
        return True

    def _kill_after_grace(self, run_id: str, tags: dict[str, str]) -> None:
        """Kill the run's process group if it still runs after the grace period."""
        deadline = time.monotonic() + self._terminate_grace
        while time.monotonic() < deadline:
            if not _worker_alive(tags):
                return
            time.sleep(0.5)
        if not _worker_alive(tags):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(tags[PID_TAG]), signal.SIGKILL)
        run = self._instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            self._instance.report_run_canceled(
                run, f"The run worker did not stop within {self._terminate_grace:.0f} s: killed."
            )

    def dispose(self) -> None:
        """Stop the warm processes (runs forked from them go on)."""
        with self._lock:
            for warm in self._warm.values():
                warm.stop()
            self._warm.clear()
        self._fallback.dispose()

    def join(self, timeout: int = 30) -> None:
        """Wait for the runs the default launcher started in this process."""
        self._fallback.join(timeout)
