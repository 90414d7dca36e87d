"""Ctrl-C stops a real `prime-worker join` or `prime-validator run` within seconds, whatever it is doing.

SIGINT reaches a worker while its vLLM engine starts (a start that cannot be interrupted and takes
a minute on a CPU), and while it downloads its first policy version from a relay that trickles the
shards; a validator gets it while it waits for submissions. Each must say it is stopping, in one
line, and exit with code 130 (docs/contributor.md) within STOP_WITHIN_S.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.support.network import Network
from tests.support.relay_doubles import TricklingRelay
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow
STOP_WITHIN_S = 5.0


def log_lines(net: Network, name: str) -> list[dict[str, object]]:
    """The JSON log lines of a node started with --json-logs (anything else it printed is skipped)."""
    lines = []
    for line in (net.root / f"{name}.log").read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            lines.append(entry)
    return lines


def logged(net: Network, name: str, text: str) -> bool:
    return any(text in str(entry.get("event")) for entry in log_lines(net, name))


def interrupt(proc: subprocess.Popen[bytes], net: Network, name: str) -> float:
    """SIGINT ``proc``; the seconds it took to exit, once it exited with 130 after a "stopping" line."""
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} still runs 60 s after SIGINT:\n{net.worker_log(name)}") from None
    took = time.monotonic() - started
    print(f"{name} exited {took:.2f} s after SIGINT")
    assert code == 130, net.worker_log(name)
    events = [str(entry.get("event")) for entry in log_lines(net, name)]
    assert any(event.startswith(f"stopping the {name.split('-')[0]}") for event in events), net.worker_log(name)
    assert not any("Traceback" in event for event in events), net.worker_log(name)
    return took


def test_ctrl_c_while_the_vllm_engine_starts(network: Network) -> None:
    worker = network.start_worker("worker-vllm", "vllm", [])
    wait_until(lambda: logged(network, "worker-vllm", "starting vLLM engine"), 300, "the vLLM engine's start")
    time.sleep(1)  # well inside the start, which takes tens of seconds
    assert not logged(network, "worker-vllm", "engine(s) ready"), network.worker_log("worker-vllm")
    took = interrupt(worker, network, "worker-vllm")
    assert took < STOP_WITHIN_S, f"stopped {took:.1f} s after SIGINT:\n{network.worker_log('worker-vllm')}"


def test_ctrl_c_during_a_download(network: Network) -> None:
    with TricklingRelay(f"{network.url}/shardcast", bytes_per_s=200, shards_only=True) as slow:
        # The trickling relay is the worker's only source: no origin fallback, no relays learnt by gossip.
        extra = ("--no-p2p", "--set", "origin_fallback_enabled=false")
        worker = network.start_worker("worker-hf", "hf", [slow.url], *extra)
        wait_until(lambda: any("/shards/" in path for path in slow.paths), 120, "the worker's first shard request")
        time.sleep(1)
        assert not logged(network, "worker-hf", "engine(s) ready"), network.worker_log("worker-hf")
        took = interrupt(worker, network, "worker-hf")
    assert took < STOP_WITHIN_S, f"stopped {took:.1f} s after SIGINT:\n{network.worker_log('worker-hf')}"


def test_ctrl_c_stops_a_waiting_validator(network: Network) -> None:
    validator = network.start_validator()
    wait_until(lambda: logged(network, "validator", "auditing"), 120, "the validator to register")
    time.sleep(1)  # in a long-poll for submissions now
    took = interrupt(validator, network, "validator")
    assert took < STOP_WITHIN_S, f"stopped {took:.1f} s after SIGINT:\n{network.worker_log('validator')}"
