"""The warm process's staleness fingerprint and process identity, on real files and processes."""

import os
import subprocess
import sys
import time

from ml_platform.warm_process import fingerprint, process_start_ticks


def test_the_fingerprint_changes_when_a_file_of_the_code_changes_appears_or_goes(tmp_path):
    code, site = tmp_path / "pkg", tmp_path / "site"
    (code / "sub").mkdir(parents=True)
    site.mkdir()
    module = code / "sub" / "module.py"
    module.write_text("A = 1\n")
    before = fingerprint([str(code)], [str(site)])
    assert fingerprint([str(code)], [str(site)]) == before

    # Compiled bytecode is written by every import: it is not the code.
    (code / "sub" / "__pycache__").mkdir()
    (code / "sub" / "__pycache__" / "module.cpython-311.pyc").write_bytes(b"x")
    assert fingerprint([str(code)], [str(site)]) == before

    module.write_text("A = 2\n")  # same size, new content
    os.utime(module, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    edited = fingerprint([str(code)], [str(site)])
    assert edited != before

    (code / "contract.yaml").write_text("x: 1\n")
    added = fingerprint([str(code)], [str(site)])
    assert added != edited
    (code / "contract.yaml").unlink()
    assert fingerprint([str(code)], [str(site)]) == edited

    # A distribution installed into an import directory changes that directory.
    (site / "newlib-1.0.dist-info").mkdir()
    os.utime(site, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    assert fingerprint([str(code)], [str(site)]) != edited


def test_a_process_is_known_by_pid_and_start_until_it_exits():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start_ticks(child.pid)
        assert start is not None
        assert process_start_ticks(child.pid) == start
        assert process_start_ticks(os.getpid()) != start
    finally:
        child.kill()
    # Dead but not yet reaped (a zombie) already counts as gone.
    deadline = time.monotonic() + 10
    while process_start_ticks(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_start_ticks(child.pid) is None
    child.wait()
    assert process_start_ticks(child.pid) is None
