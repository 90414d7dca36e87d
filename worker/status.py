"""The live status line people see while `prime-worker join` runs (machines read the JSON logs)."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from worker.loop import WorkerState, sleep_unless_stopped


def render(state: WorkerState) -> Table:
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("policy", "tasks", "samples", "tokens/s", "refused", "now", "uptime"):
        table.add_column(column)
    uptime = int(time.monotonic() - state.started_at)
    table.add_row(
        f"v{state.policy_version}" if state.policy_version is not None else "-",
        str(state.num_tasks_done),
        str(state.num_samples),
        f"{state.tokens_per_s:.1f}",
        str(state.num_refused),
        state.current_task or "waiting for a task",
        f"{uptime // 60}m{uptime % 60:02d}s",
    )
    if state.last_error:
        table.caption = f"last problem: {state.last_error}"
    return table


async def show_status(state: WorkerState, stop: asyncio.Event, console: Console | None = None) -> None:
    """Redraw the status table every second until ``stop`` is set."""
    with Live(render(state), console=console or Console(stderr=True), refresh_per_second=2, transient=False) as live:
        while not stop.is_set():
            live.update(render(state))
            await sleep_unless_stopped(stop, 1.0)
        live.update(render(state))
