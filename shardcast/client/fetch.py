"""`prime-relay fetch`: one version downloaded by hand, shown as a progress bar on stderr or as JSON events.

The download itself is :func:`shardcast.client.download.download_version` (verified, resumable); here
are what "latest" means for a person asking, the bar that follows the client's events (one bar for the
whole download, patch chains included), and how a failure ends the command.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from protocol.errors import PrimeError
from runtime.cli import err_console, fail
from shardcast.client.download import describe_failure, download_version, latest_version, newest_known
from shardcast.client.transfer import EventSink, TransferOptions


def fetch_from_cli(
    version: int | None,
    relays: list[str],
    coordinator_id: str,
    out: Path,
    transfer: dict[str, Any],
    json_events: bool,
    run_name: str | None,
) -> None:
    """Download ``version`` (None: the latest) under ``out`` with the :class:`TransferOptions` fields in ``transfer``;
    print its directory, or with ``json_events`` every event as a JSON line. A failure is one line and exit 1 (its
    JSON event with ``json_events``); Ctrl-C says how to resume."""
    options = TransferOptions.model_validate(transfer)
    progress = None if json_events else ProgressBar()
    sink = progress.on_event if progress is not None else print_json
    try:
        number = resolve_latest(relays, coordinator_id, out, sink) if version is None else version
        path = download_version(number, relays, coordinator_id, out, options, on_event=sink, run_name=run_name)
    except PrimeError as exc:
        if json_events:
            print_json(describe_failure(exc))
            raise typer.Exit(1) from None
        fail(f"fetch: {exc.message}")
    except KeyboardInterrupt:
        fail("interrupted; run the same command again to resume (verified shards are kept)", 130)
    finally:
        if progress is not None:
            progress.stop()
    if not json_events:
        typer.echo(str(path))


def resolve_latest(relays: list[str], coordinator_id: str, out: Path, sink: EventSink) -> int:
    """What 'latest' means here: the newest version the relays list, never older than one held or seen."""
    floor = newest_known(out, coordinator_id)
    listed = asyncio.run(latest_version(relays))
    if floor is not None and floor > listed:
        sink(
            {
                "event": "relays_behind",
                "listed": listed,
                "held": floor,
                "detail": f"the relays list v{listed} but v{floor} is already held or was seen signed under {out}; "
                "staying on it (a relay may be hiding newer versions)",
            }
        )
        return floor
    return listed


def print_json(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class ProgressBar:
    """A rich progress bar on stderr, driven by the client's events."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("[bold]v{task.fields[version]}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
            console=err_console,
            transient=False,
        )
        self.task_id: Any = None
        self.num_failures = 0
        self.route = ""
        """How the version is had: empty for a full download, else which patch chain from which base."""

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "manifest" and self.task_id is not None:  # the next version of a planned chain
            self.progress.advance(self.task_id, event["bytes_resumed"])
        elif kind in ("manifest", "plan"):
            # one bar for the whole download: a plan's total is the full start and every patch of its chain
            total = event["total_bytes"] if kind == "manifest" else event["bytes"]
            if kind == "plan":
                saved = max(0, event["checkpoint_bytes"] - event["bytes"])
                start = f"held v{event['base']}" if event["from"] == "held" else f"full v{event['base']}"
                self.route = f"patch from {start}, saves {human_bytes(saved)}"
            if self.task_id is not None:  # planned again (a damaged base was dropped): start the bar over
                self.progress.remove_task(self.task_id)
            self.progress.start()
            self.task_id = self.progress.add_task(
                "fetch",
                total=total,
                completed=event.get("bytes_resumed", 0),
                version=event["version"],
                note=self.route,
            )
        elif kind == "done" and not event.get("cached") and self.task_id is not None:
            if event.get("kind") == "patch":
                note = f"patch from v{event['base']}: {human_bytes(event['bytes_saved'])} saved"
            else:
                note = "full"
            self.progress.update(self.task_id, note=note)
        elif kind == "patch_refused":
            err_console.print(f"[yellow]patch v{event['version']} against v{event['base']} refused: {event['reason']}")
        elif kind == "shard_done" and self.task_id is not None:
            self.progress.advance(self.task_id, event["bytes"])
        elif kind == "relays_behind":
            err_console.print(f"[yellow]{event['detail']}")
        elif kind == "shard_failed" and self.task_id is not None:
            self.num_failures += 1
            self.progress.update(self.task_id, note=f"[yellow]{self.num_failures} retried ({event['kind']})")

    def stop(self) -> None:
        self.progress.stop()


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
