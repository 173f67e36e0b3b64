"""The warm process of the forking run launcher (ml_platform/launcher.py).

`ForkingRunLauncher` starts this file as a script with the code location's Python. It imports
Dagster, the heavy libraries the steps use and the code location once, then forks one child
per run; each child runs `dagster api execute_run` in-process, so a run starts without paying
the ~10 s of imports a new process costs.

It talks to the launcher over one end of a socket pair (no address anyone else can reach),
one JSON object a line, and exits when the launcher's end closes (the daemon died or stopped).

Run as a script, this file imports only the standard library before the launcher has taken the
fingerprint of the code it is about to import; the launcher also imports it as a module for
`fingerprint` and `process_start_ticks`, which is why nothing runs at import.
"""

import argparse
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from hashlib import sha256
from pathlib import Path
from typing import Any, NoReturn

# What a run imports in a new process and the code location does not import at its own import
# (steps import these lazily to keep sensors and the code server light).
DEFAULT_PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "sklearn.linear_model",
    "scipy.stats",
    "great_expectations",
    "matplotlib.pyplot",
    # What `dagster api execute_run` itself imports before and while it runs.
    "dagster",
    "dagster._cli",
    "dagster._core.execution.api",
    "dagster._core.storage.runs.sqlite",
    "dagster._core.storage.event_log.sqlite",
    "dagster._core.storage.schedules.sqlite",
)


def _files(tree: Path) -> Iterator[Path]:
    for path in sorted(tree.rglob("*")):
        if "__pycache__" not in path.parts and path.is_file():
            yield path


def fingerprint(trees: Iterable[str], dirs: Iterable[str]) -> str:
    """A digest of every file under `trees` (path, size, mtime) and of the entries of `dirs`.

    `trees` are the code location's package directories: a changed, added or removed file
    there changes the digest. `dirs` are the interpreter's import directories (site-packages
    among them), not walked: installing, upgrading or removing a distribution adds or removes
    an entry there, which changes the directory's mtime.
    """
    digest = sha256()
    for tree in trees:
        for path in _files(Path(tree)):
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    for directory in dirs:
        try:
            mtime = os.stat(directory).st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        digest.update(f"{directory}\0{mtime}\n".encode())
    return digest.hexdigest()


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None when it is gone or a zombie.

    A pid alone can be reused by an unrelated process once its run worker exited; the pair
    (pid, start ticks) names one process for its whole life.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, start = fields[0], fields[19]
    if state in ("Z", "X"):
        return None
    return int(start)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class _Lines:
    """Newline-delimited JSON messages read from a socket, without blocking past `timeout`."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next message; None on timeout. Raises EOFError when the other end closed."""
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return dict(json.loads(line))


def _package_trees(module: str, working_directory: str | None) -> list[str]:
    """The directories of the code location's top-level package (or its file), found unimported."""
    top = module.split(".")[0]
    added = working_directory is not None and working_directory not in sys.path
    if added:
        sys.path.insert(0, str(working_directory))
    try:
        spec = importlib.util.find_spec(top)
    finally:
        if added:
            sys.path.remove(str(working_directory))
    if spec is None:
        raise ImportError(f"no module named {top!r} for the code location {module!r}")
    if spec.submodule_search_locations:
        return sorted(str(Path(p).resolve()) for p in spec.submodule_search_locations)
    return [str(Path(str(spec.origin)).resolve().parent)]


# The run workers forked and not yet reaped.
_children: set[int] = set()


def _reap() -> None:
    """Collect the exit status of finished children so that none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _children.discard(pid)


def _forward_and_exit(signum: int, _frame: object) -> None:
    """Pass a signal sent to the daemon's process group on to the runs, then exit.

    Run workers of the default launcher share the daemon's process group, so Ctrl-C on
    `dagster dev` or a signal to the group interrupts their runs; forked ones have groups of
    their own and would miss it. The daemon merely dying (closing the socket) leaves runs
    running, as it leaves the default launcher's.
    """
    for pid in list(_children):
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            _children.discard(pid)
    raise SystemExit(128 + signum)


def _run_child(sock: socket.socket, execute_run_args: str) -> NoReturn:
    """The forked child: `dagster api execute_run` in this process, then exit without cleanup.

    Runs exactly what `python -m dagster api execute_run <args>` runs (the same module as
    `__main__`, the same arguments), so events, logs, compute logs, statuses and interrupts
    behave as for a run worker started by any other launcher. It ends with os._exit: the
    exit handlers and finalisers inherited from the warm process belong to it, not to the run.
    """
    import atexit
    import logging
    import runpy
    import traceback

    code = 1
    try:
        # First the signals: the warm process's handler would pass them on to its children.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        _children.clear()
        sock.close()
        # Its own process group, so that terminating the run reaches whatever it started.
        os.setpgid(0, 0)
        # Exit handlers registered before the fork are the warm process's; only the run's own
        # handlers run when the run ends.
        atexit._clear()
        # A forked child inherits its parent's random state; numpy's global generator would
        # give every run the same draws where a new process gets a fresh seed.
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        sys.argv = ["dagster", "api", "execute_run", execute_run_args]
        try:
            runpy.run_module("dagster", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                sys.stderr.write(f"{exit_.code}\n")
                code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm_up(module: str, attribute: str, working_directory: str | None, preload: list[str]):
    """Import the libraries and the code location the way a run worker will."""
    for name in preload:
        importlib.import_module(name)
    from dagster._core.code_pointer import ModuleCodePointer

    # The pointer a run's job origin carries; loading it imports the module exactly as the
    # run worker's reconstruction will (the loaded target itself is not called: the run
    # builds its definitions from the environment and the contracts when it starts).
    ModuleCodePointer(module, attribute, working_directory).load_target()


def serve(sock: socket.socket, args: argparse.Namespace) -> None:
    """Handshake, warm up, then fork a child for each run until the launcher goes away."""
    lines = _Lines(sock)
    parent = os.getppid()
    working_directory = args.working_directory or None
    trees = _package_trees(args.module, working_directory)
    dirs = sorted({os.path.abspath(p or ".") for p in sys.path if os.path.isdir(p or ".")})
    # The launcher takes the fingerprint of these before anything of the code is imported, so
    # a file that changes while this process imports it makes the process stale, not current.
    _send(sock, {"watch": {"trees": trees, "dirs": dirs}})
    while (go := lines.read(1.0)) is None:
        if os.getppid() != parent:
            return
    if go.get("go") is not True:
        return
    try:
        _warm_up(args.module, args.attribute, working_directory, args.preload)
    except Exception as error:  # reported to the launcher, which then launches the default way
        _send(sock, {"error": f"warm-up failed: {error!r}"})
        return
    threads = [t.name for t in threading.enumerate()]
    if len(threads) != 1:
        # Forking a process with other threads copies locks they may hold: refuse to serve.
        _send(sock, {"error": f"the warm process has threads {threads}: forking is unsafe"})
        return
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _forward_and_exit)
    _send(sock, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            request = lines.read(1.0)
        except EOFError:
            return
        _reap()
        if os.getppid() != parent:
            return
        if request is None:
            continue
        if threading.active_count() != 1:
            _send(sock, {"error": f"{threading.active_count()} threads: forking is unsafe"})
            continue
        pid = os.fork()
        if pid == 0:
            _run_child(sock, request["execute_run_args"])
        _children.add(pid)
        _send(sock, {"pid": pid, "start": process_start_ticks(pid), "run_id": request["run_id"]})


def main() -> None:
    """Serve the launcher on the socket passed as --fd."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--module", required=True)
    parser.add_argument("--attribute", required=True)
    parser.add_argument("--working-directory", default="")
    parser.add_argument("--preload", nargs="*", default=list(DEFAULT_PRELOAD))
    args = parser.parse_args()
    # Run as a script, Python puts this file's directory (the package) first on the path, which
    # a run worker started with `python -m dagster` does not have: it has the working directory.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = os.getcwd()
    sock = socket.socket(fileno=args.fd)
    started = time.monotonic()
    try:
        serve(sock, args)
    except EOFError:
        pass
    finally:
        sock.close()
        sys.stderr.write(
            f"ml_platform warm process {os.getpid()} exits after"
            f" {time.monotonic() - started:.0f} s\n"
        )


if __name__ == "__main__":
    main()
