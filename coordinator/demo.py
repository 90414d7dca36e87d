"""`make demo`: the most end-to-end thing that works today, saying plainly what it is.

The full demo network (coordinator, relay, two workers, a validator, RL steps) is issue 9.
Until it lands this shows the foundation every role stands on: node identities created on
first use with 0600 keys, a request signed by a worker and verified as the ledger will
verify it, and the tampered and replayed copies refused.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console

from protocol.errors import SignatureError
from protocol.identity import key_path, load_or_create_identity
from protocol.signing import MemoryReplayCache, sign_request, verify_request


def main() -> None:
    console = Console()
    console.print("[bold]prime-network demo[/]: the demo network is not built yet (issue 9).")
    console.print("Running what works today: identities and signed requests.\n")
    with tempfile.TemporaryDirectory(prefix="prime-demo-") as tmp:
        coordinator = load_or_create_identity(Path(tmp) / "coordinator")
        worker = load_or_create_identity(Path(tmp) / "worker")
        mode = key_path(Path(tmp) / "worker").stat().st_mode & 0o777
        console.print(f"coordinator node id {coordinator.node_id}")
        console.print(f"worker node id      {worker.node_id} (key file mode {mode:04o})")
        cache = MemoryReplayCache()
        body = b'{"v":1,"max_tasks":1,"policy_versions_held":[0]}'
        headers = sign_request(worker, "POST", "/v1/leases", body)
        verified = verify_request("POST", "/v1/leases", body, headers, cache)
        console.print(f"[green]signed lease request verified[/] for {verified.node_id[:16]}...")
        cases = {
            "replayed": ("POST", "/v1/leases", body),
            "tampered body": ("POST", "/v1/leases", body.replace(b"1", b"9")),
            "other path": ("POST", "/v1/submissions", body),
        }
        for label, (method, path, payload) in cases.items():
            try:
                verify_request(method, path, payload, headers, cache)
                console.print(f"[red]{label} request was accepted: this is a bug[/]")
                raise SystemExit(1)
            except SignatureError as exc:
                console.print(f"[green]{label} request refused[/]: {exc.code}: {exc.message[:80]}")


if __name__ == "__main__":
    main()
