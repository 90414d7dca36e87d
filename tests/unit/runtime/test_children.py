"""runtime.children: a child's output reaches a bounded, rotated log; exits are reported with the tail."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from protocol.errors import ChildExitedError
from runtime.children import Child, LogLimits, RotatingLog, log_tail, stop_children


def test_a_rotating_log_keeps_its_newest_bytes_within_the_limits(tmp_path: Path) -> None:
    path = tmp_path / "node.log"
    log = RotatingLog(path, LogLimits(max_bytes=100, backups=2))
    for index in range(50):
        log.write(f"line {index:03d}\n".encode())
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["node.log", "node.log.1", "node.log.2"]
    assert all(f.stat().st_size <= 100 for f in files)
    written = "".join(f"line {i:03d}\n" for i in range(50))
    kept = "".join((tmp_path / name).read_text() for name in ("node.log.2", "node.log.1", "node.log"))
    assert written.endswith(kept) and len(kept) > 200
    assert log_tail(path, 150) == written[-150:]


def test_a_rotating_log_appends_to_what_an_earlier_process_wrote(tmp_path: Path) -> None:
    path = tmp_path / "node.log"
    path.write_bytes(b"x" * 90)
    log = RotatingLog(path, LogLimits(max_bytes=100, backups=0))
    log.write(b"y" * 20)  # 110 > 100: the old file goes (no backups), the new one starts
    log.close()
    assert path.read_bytes() == b"y" * 20 and not (tmp_path / "node.log.1").exists()


def test_a_chatty_child_keeps_a_bounded_log(tmp_path: Path) -> None:
    script = "import sys\nfor i in range(20000): print('x' * 50, i)\nprint('done', file=sys.stderr)"
    child = Child("chatty", [sys.executable, "-c", script], tmp_path / "chatty.log", limits=LogLimits(64 << 10, 2))
    child.start()
    assert child.proc is not None
    assert child.proc.wait(timeout=60) == 0
    assert child.tail(100).endswith("done\n")
    logs = sorted(p.name for p in tmp_path.iterdir())
    assert logs == ["chatty.log", "chatty.log.1", "chatty.log.2"]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 3 * (64 << 10)


def test_an_exited_child_is_reported_with_its_output(tmp_path: Path) -> None:
    script = "import sys; print('cannot bind port 1', file=sys.stderr); sys.exit(5)"
    child = Child("relay", [sys.executable, "-c", script], tmp_path / "relay.log")
    child.check()  # not started yet: nothing to report
    child.start()
    assert child.proc is not None
    child.proc.wait(timeout=30)
    with pytest.raises(ChildExitedError, match=r"relay exited with code 5 \(log .*relay\.log\)\. Free it") as raised:
        child.check(fix="Free it.")
    assert "cannot bind port 1" in raised.value.message


def test_stop_ends_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
    script += "time.sleep(60)"
    child = Child("stubborn", [sys.executable, "-c", script], tmp_path / "stubborn.log")
    child.start()
    deadline = time.monotonic() + 20
    while "up" not in log_tail(child.log_path, 100) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    stop_children([child], timeout_s=0.5)
    assert not child.running and child.returncode == -9
    assert time.monotonic() - started < 10
