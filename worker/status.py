"""The live status line people see while `prime-worker join` runs (machines read the JSON logs)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table

from worker.loop import WorkerState, sleep_unless_stopped


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


def format_uptime(started_at: float) -> str:
    """Time since ``started_at`` (a time.monotonic() reading) as ``12m05s``."""
    uptime = int(time.monotonic() - started_at)
    return f"{uptime // 60}m{uptime % 60:02d}s"


async def show_live(
    render_now: Callable[[], RenderableType], stop: asyncio.Event, console: Console | None = None
) -> None:
    """Redraw ``render_now()`` every second until ``stop`` is set (the worker's and the validator's live status)."""
    with Live(render_now(), console=console or Console(stderr=True), refresh_per_second=2, transient=False) as live:
        while not stop.is_set():
            live.update(render_now())
            await sleep_unless_stopped(stop, 1.0)
        live.update(render_now())


async def show_status(state: WorkerState, stop: asyncio.Event, console: Console | None = None) -> None:
    """Redraw the status table every second until ``stop`` is set."""
    await show_live(lambda: render(state), stop, console)
