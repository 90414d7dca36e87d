"""One process per data dir: the second holder is refused with the first one named; a crash frees the lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.errors import StartupError
from runtime.data_dir_lock import hold_data_dir


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    refused = pytest.raises(StartupError, match=rf"in use by prime-validator \(pid {os.getpid()} on ")
    with hold_data_dir(tmp_path / "node", "prime-validator"), refused:
        hold_data_dir(tmp_path / "node", "prime-validator")
    with hold_data_dir(tmp_path / "node", "prime-validator"):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = (
        "import time; from pathlib import Path; from runtime.data_dir_lock import hold_data_dir; "
        f"hold_data_dir(Path({str(tmp_path)!r}), 'x'); print(1, flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"1"
    with pytest.raises(StartupError, match=f"pid {child.pid}"):
        hold_data_dir(tmp_path, "y")
    child.kill()
    child.wait()
    hold_data_dir(tmp_path, "y").release()


def test_a_garbled_lock_file_still_refuses(tmp_path: Path) -> None:
    with hold_data_dir(tmp_path, "prime-worker"):
        (tmp_path / "node.lock").write_text("{not json")
        with pytest.raises(StartupError, match="in use by another process"):
            hold_data_dir(tmp_path, "prime-worker")
