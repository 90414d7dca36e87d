"""Children of the coordinator: they die with it (PR_SET_PDEATHSIG), and a dead trainer job is reported clearly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.processes.trainer_process import TrainerProcess
from protocol.errors import ChildExitedError
from trainer.config import LossConfig, TrainerSection
from trainer.service import ServiceSpec
from trainer.transport import TrainDir

PARENT = """
import subprocess, sys, time
from runtime.lifetime import child_preexec
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=child_preexec())
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_child_dies_when_its_parent_is_sigkilled() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[4])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid)


def _group_members(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except ProcessLookupError:
                continue
    return found


class FailingTrainer(TrainerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('out of memory', file=sys.stderr); sys.exit(3)"]


class SleepingTrainer(TrainerProcess):
    def command(self) -> list[str]:
        sleeper = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"
        return [sys.executable, "-c", sleeper]


def _spec(tmp_path: Path) -> tuple[TrainDir, ServiceSpec]:
    return TrainDir(tmp_path / "train"), ServiceSpec(trainer=TrainerSection(), loss=LossConfig(), num_steps=1)


def test_a_trainer_job_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    train_dir, spec = _spec(tmp_path)
    trainer = FailingTrainer(train_dir, spec, nproc=1)
    trainer.start()
    assert trainer.child is not None and trainer.child.proc is not None
    trainer.child.proc.wait(timeout=30)
    assert not trainer.running
    with pytest.raises(ChildExitedError, match=r"exited with code 3 \(log .*trainer\.log\)") as raised:
        trainer.check()
    assert "out of memory" in raised.value.message
    assert (train_dir.root / "service.json").is_file()


def test_stopping_the_trainer_stops_its_whole_process_group(tmp_path: Path) -> None:
    train_dir, spec = _spec(tmp_path)
    trainer = SleepingTrainer(train_dir, spec, nproc=1)
    trainer.start()
    assert trainer.child is not None
    pid = trainer.child.pid
    deadline = time.monotonic() + 20
    grandchildren: list[int] = []
    while not grandchildren and time.monotonic() < deadline:
        grandchildren = [member for member in _group_members(pid) if member != pid]
        time.sleep(0.05)
    assert grandchildren, "the job's own child did not start"
    trainer.check()  # still running: nothing to report
    trainer.stop(timeout_s=10)
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in grandchildren)


@pytest.mark.parametrize(("operator", "expected"), [(None, "1"), ("2", "2")])
def test_the_local_networks_nodes_compute_with_one_thread_unless_told(
    operator: str | None, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coordinator.processes.local_network import Processes

    if operator is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", operator)
    procs = Processes(tmp_path)
    procs.start("validator", [sys.executable, "-c", "import os; print('threads', os.environ['OMP_NUM_THREADS'])"])
    child = procs.children["validator"]
    assert child.proc is not None and child.proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while "threads" not in (text := (tmp_path / "validator.log").read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"threads {expected}" in text
