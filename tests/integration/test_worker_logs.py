"""A real `prime-worker join` with the vLLM engine logs what a contributor needs, and vLLM's lines follow --log-level.

Two vLLM workers join one run, one at the default level (human lines, what a contributor sees),
one at ``--log-level debug`` (JSON lines); both start their engine, submit under policy v0 and
reload their weights in place for v1. At the default level nothing of vLLM's start-up or
reload chatter shows (no INFO line of its loggers, no traceback, no line in its own format, no
progress bar, no "RotaryEmbedding: Failed to load weights"); at debug vLLM's lines are all
there, as JSON lines of the worker's own log, the RotaryEmbedding one included. A third worker, with
the HF engine and --json-logs, prints nothing but JSON lines (no progress bar of transformers).
"""

from __future__ import annotations

import json
import re
import signal

import pytest

from tests.support.network import Network, submissions_by_node
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow


def read_log(net: Network, name: str) -> str:
    return (net.root / f"{name}.log").read_text(errors="replace")


def test_vllm_lines_follow_the_log_level(network: Network) -> None:
    net = network
    quiet = net.start_worker("worker-info", "vllm", [], json_logs=False)
    loud = net.start_worker("worker-debug", "vllm", [], "--log-level", "debug")
    hf = net.start_worker("worker-hf", "hf", [])
    wait_until(lambda: len(submissions_by_node(net)) == 3, 480, "the three workers to submit under policy v0")
    net.publish(1)

    def both_reloaded() -> bool:
        return all("reloaded weights" in read_log(net, name) for name in ("worker-info", "worker-debug"))

    wait_until(both_reloaded, 180, "both workers to reload their engine for policy v1")
    for proc in (quiet, loud, hf):
        proc.send_signal(signal.SIGINT)
    assert quiet.wait(timeout=60) == 130 and loud.wait(timeout=60) == 130 and hf.wait(timeout=60) == 130
    not_json = [line for line in read_log(net, "worker-hf").splitlines() if line.strip() and not line.startswith("{")]
    assert not not_json, "\n".join(not_json[:20])

    shown = read_log(net, "worker-info")
    assert "vLLM engine reloaded weights" in shown and "stopping the worker" in shown, shown[-3000:]
    noise = [
        line
        for line in shown.splitlines()
        if re.search(r"(INFO|DEBUG)\s+vllm", line)  # a vLLM logger's INFO line, in our format
        or "(MainProcess" in line  # a line in vLLM's own format
        or "Traceback" in line
        or "RotaryEmbedding" in line
        or "Loading safetensors" in line
        or "Warning" in line  # Python warnings, torch's C++ ones ("[W... ] Warning: ...")
    ]
    assert not noise, "\n".join(noise[:20])

    lines = read_log(net, "worker-debug").splitlines()
    assert not [line for line in lines if line.startswith("[transformers]")], "transformers' own handler still prints"
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    vllm = [entry for entry in entries if str(entry["logger"]).startswith("vllm")]
    assert any(entry["level"] in ("debug", "info") for entry in vllm), [entry["event"] for entry in entries][:40]
    assert any("RotaryEmbedding: Failed to load weights" in entry["event"] for entry in vllm)
