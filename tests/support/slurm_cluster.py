"""A single-node SLURM cluster on this machine for the SLURM tests: munged, slurmctld and slurmd, all in a tmp dir.

Debian's `slurm-wlm` and `munge` (installed by :func:`ensure_installed` when missing) run as
root with a config written here: their own munge key and socket, slurm.conf with
``SlurmctldHost=localhost`` and one node ``localhost`` (declared with more CPUs than the machine
has, via ``SlurmdParameters=config_overrides``, so a coordinator job and a worker array run at
once), free ports, and state, spool, pid and log files under the tmp dir. Nothing global is
written; :meth:`SlurmCluster.stop` stops the three daemons by PID. Client commands get the
config through ``SLURM_CONF`` (:meth:`SlurmCluster.env`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from runtime.children import stop_processes
from runtime.ports import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch")
NODE_CPUS = 8


class SlurmUnavailableError(RuntimeError):
    """SLURM could not be installed or started here."""


def ensure_installed() -> None:
    """Install Debian's slurm-wlm and munge when a binary is missing (as root; apt-get update if needed)."""
    if all(shutil.which(name) or Path(f"/usr/sbin/{name}").exists() for name in DAEMONS):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmUnavailableError("slurm-wlm and munge are missing and this is not a root Debian machine")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"]
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SlurmUnavailableError(f"apt-get install slurm-wlm munge failed: {done.stderr[-2000:]}")


def binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if found is None:
        raise SlurmUnavailableError(f"{name} is not installed")
    return found


SLURM_CONF = """\
ClusterName=prime-test
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=3600
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run([binary(argv[0]), *argv[1:]], capture_output=True, text=True, env=self.env(), timeout=60)
        assert done.returncode == 0, f"{argv}: {done.stderr}"
        return done.stdout

    def job_states(self, job_id: str) -> list[str]:
        """The state of every task of job ``job_id`` (one per array task), e.g. ``["RUNNING", "PENDING"]``."""
        out = self.run("scontrol", "show", "job", job_id, "--oneliner")
        words = [word for line in out.splitlines() for word in line.split()]
        return [word.split("=", 1)[1] for word in words if word.startswith("JobState=")]

    def wait_job(self, job_id: str, done: set[str], timeout_s: float) -> list[str]:
        """Wait until every task of the job is in one of the ``done`` states; return the states."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self.job_states(job_id)
            if states and all(state in done for state in states):
                return states
            time.sleep(1)
        raise AssertionError(f"job {job_id} is still {self.job_states(job_id)} after {timeout_s} s")

    def log(self) -> str:
        return "\n".join(
            f"--- {name}\n" + (self.root / name).read_text(errors="replace")[-3000:]
            for name in ("munged.log", "slurmctld.log", "slurmd.log")
            if (self.root / name).exists()
        )

    def start(self, timeout_s: float = 60) -> None:
        for name in ("state", "spool"):
            (self.root / name).mkdir(mode=0o700)
        key = self.root / "munge.key"
        subprocess.run([binary("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True, timeout=60)
        key.chmod(0o600)
        self.conf.write_text(
            SLURM_CONF.format(root=self.root, ctld_port=free_port(), slurmd_port=free_port(), cpus=NODE_CPUS)
        )
        self._spawn(
            "munged",
            "-F",
            "-f",
            f"--socket={self.root / 'munge.sock'}",
            f"--key-file={key}",
            f"--log-file={self.root / 'munged.log'}",
            f"--pid-file={self.root / 'munged.pid'}",
            f"--seed-file={self.root / 'munged.seed'}",
        )
        self._wait(lambda: (self.root / "munge.sock").exists(), "munged never created its socket", timeout_s)
        self._spawn("slurmctld", "-D", "-c", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", "localhost")
        self._wait(self._node_idle, "the node never became idle", timeout_s)

    def _node_idle(self) -> bool:
        done = subprocess.run(
            [binary("sinfo"), "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env(), timeout=30
        )
        return done.returncode == 0 and done.stdout.strip() in {"idle", "mixed", "allocated"}

    def _spawn(self, name: str, *argv: str) -> None:
        log = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the daemon
        self.procs.append(subprocess.Popen([binary(name), *argv], stdout=log, stderr=log, env=self.env()))

    def _wait(self, predicate: Callable[[], bool], message: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SlurmUnavailableError(f"{proc.args!r} exited with {proc.returncode}:\n{self.log()}")
            time.sleep(0.5)
        raise SlurmUnavailableError(f"{message} within {timeout_s} s:\n{self.log()}")

    def stop(self) -> None:
        """Cancel what is still queued (so no job process outlives slurmd), then stop the daemons by PID."""
        if self.procs and all(proc.poll() is None for proc in self.procs):
            subprocess.run([binary("scancel"), "--user=root"], env=self.env(), capture_output=True, timeout=60)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self._queued():
                time.sleep(1)
        stop_processes(list(reversed(self.procs)))

    def _queued(self) -> bool:
        done = subprocess.run([binary("squeue"), "-h"], capture_output=True, text=True, env=self.env(), timeout=30)
        return done.returncode == 0 and bool(done.stdout.strip())


@contextmanager
def slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """Install (if needed) and start a one-node cluster in ``root``; stop its daemons by PID on exit."""
    ensure_installed()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged wants its socket's directory searchable by all
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
