"""The live status display a person sees while a node runs (machines read the JSON logs instead)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.live import Live

from node.retry import sleep_unless_stopped


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
