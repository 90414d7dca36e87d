"""The coordinator's trainer child: one ``torchrun -m trainer.service`` job for the whole run.

Started once when the orchestrator starts and kept up across steps. It runs in a process
group of its own (so stopping it stops every rank) and dies with the coordinator
(``PR_SET_PDEATHSIG`` on torchrun, and on each rank towards torchrun), so a SIGKILLed
coordinator leaves no orphan ranks behind; a restarted coordinator starts a fresh one that
resumes from the last trainer checkpoint. If the job exits while steps remain, the
orchestrator stops the run with :class:`ChildExitedError` naming the log to read (a crash
there is a bug or a lack of resources that a silent restart would only repeat).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from coordinator.process import free_port
from protocol.errors import ChildExitedError
from protocol.lifetime import child_preexec
from trainer.service import ServiceSpec, write_spec
from trainer.transport import TrainDir


class TrainerProcess:
    def __init__(self, train_dir: TrainDir, spec: ServiceSpec, nproc: int, cpus: list[int] | None = None) -> None:
        self.cpus = cpus or []
        self.train_dir = train_dir
        self.spec = spec
        self.nproc = nproc
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        torchrun = Path(sys.executable).parent / "torchrun"
        return [
            str(torchrun) if torchrun.exists() else sys.executable,
            *([] if torchrun.exists() else ["-m", "torch.distributed.run"]),
            "--nproc-per-node",
            str(self.nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "trainer.service",
            "--train-dir",
            str(self.train_dir.root),
            "--coordinator-pid",
            str(os.getpid()),
        ]

    def start(self) -> None:
        """Write the service spec and launch torchrun (from a thread that outlives the job)."""
        self.train_dir.root.mkdir(parents=True, exist_ok=True)
        write_spec(self.train_dir, self.spec)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        with self.train_dir.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=child_preexec(self.cpus),
            )

    def check(self) -> None:
        """Raise :class:`ChildExitedError` when the job has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.train_dir.log_path.read_text(errors="replace")[-1500:]
            raise ChildExitedError(
                f"the trainer service (torchrun, pid {self.proc.pid}) exited with code {self.proc.returncode}; "
                f"its log is {self.train_dir.log_path}. Fix the cause and start the coordinator again: it "
                f"resumes from the last trainer checkpoint.\n{tail}"
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the job's process group, then SIGKILL it if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
