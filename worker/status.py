"""The live status line people see while `prime-worker join` runs (machines read the JSON logs)."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.table import Table

from node.live import format_uptime, show_live
from worker.loop import WorkerState


def render(state: WorkerState) -> Table:
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("policy", "tasks", "samples", "tokens/s", "refused", "now", "uptime"):
        table.add_column(column)
    table.add_row(
        f"v{state.policy_version}" if state.policy_version is not None else "-",
        str(state.num_tasks_done),
        str(state.num_samples),
        f"{state.tokens_per_s:.1f}",
        str(state.num_refused),
        state.current_task or "waiting for a task",
        format_uptime(state.started_at),
    )
    if state.last_error:
        table.caption = f"last problem: {state.last_error}"
    return table


async def show_status(state: WorkerState, stop: asyncio.Event, console: Console | None = None) -> None:
    """Redraw the status table every second until ``stop`` is set."""
    await show_live(lambda: render(state), stop, console)
