"""A node's life as a process: its work until the run ends, a ban or a stop, and the exit code that says which.

Workers and validators live alike: Ctrl-C or SIGTERM stops them within seconds (:mod:`node.stopping`, exit
130), an optional live display runs beside the work, the run's end is a clean exit (0), a refusal of the node
itself (banned, or a validator not approved) exits 3, any other refused request 4, and every other error
its one line (:func:`runtime.cli.exit_on_error`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from node.stopping import stopping
from protocol.errors import ForbiddenError, PrimeError, RequestRefused, RunEndedError
from runtime.cli import EXIT_BANNED, EXIT_OK, EXIT_REFUSED, exit_on_error, fail

Job = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""A coroutine function of the node's stop event: the work, or the live display."""


def run_node(role: str, work: Job, display: Job | None = None) -> int:
    """Run ``work`` (and ``display`` beside it) until it returns, the run ends or the node is stopped; the exit
    code. ``role`` names the node in its messages and its logger ("worker", "validator")."""

    async def main() -> int:
        async with stopping(role) as stop:
            shown = asyncio.create_task(display(stop)) if display is not None else None
            try:
                await work(stop)
            finally:
                stop.set()
                if shown is not None:
                    await shown
        return EXIT_OK

    try:
        return asyncio.run(main())
    except RunEndedError as exc:  # a worker submits its work in flight first; a validator audits every pending one
        logging.getLogger(role).info("%s; stopping", exc.message)
        return EXIT_OK
    except ForbiddenError as exc:
        fail(f"the coordinator refuses this {role}: {exc.message}", EXIT_BANNED)
    except RequestRefused as exc:
        fail(f"the coordinator refused a request: {exc.message}", EXIT_REFUSED)
    except PrimeError as exc:
        exit_on_error(exc)
