"""`prime-coordinator status`: a running run at a glance, asked of its API (nothing is opened or locked).

Step (and the run's total), the newest steps' pace and the time left at that pace, live workers and
validators, and what the validators decided so far, from ``GET /v1/status``.
"""

from __future__ import annotations

import httpx
import pydantic

from coordinator.config import CoordinatorConfig
from coordinator.processes.builtin_validator import local_url
from protocol import routes
from protocol.errors import StartupError
from protocol.schemas import RunStatus


def duration(seconds: float) -> str:
    """``seconds`` as ``1h02m``, ``3m05s`` or ``42s``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def describe_status(status: RunStatus) -> list[str]:
    """The lines `prime-coordinator status` prints."""
    if status.num_train_steps:
        step = f"step {status.num_train_steps_done}/{status.num_train_steps}"
        if status.run_ended:
            step += " (the run has ended)"
        elif status.step_s is not None:
            left = (status.num_train_steps - status.num_train_steps_done) * status.step_s
            step += f", {status.step_s:.1f} s a step, about {duration(left)} to go"
    else:
        step = "no RL loop (ledger and origin only)"
    decided = status.num_submissions_accepted + status.num_submissions_rejected
    rejected_share = f" ({status.num_submissions_rejected / decided:.1%})" if decided else ""
    return [
        f"run {status.run_name!r}: {step}; policy v{status.current_policy_version}",
        f"nodes: {status.num_workers_live} worker(s) and {status.num_validators_live} validator(s) live",
        f"submissions: {status.num_submissions_accepted} accepted, {status.num_submissions_rejected} rejected"
        f"{rejected_share}, {status.num_submissions_pending} pending; {status.num_tasks_open} task(s) open",
    ]


def fetch_status(url: str, timeout_s: float = 10.0) -> RunStatus:
    """The run's status from the coordinator at ``url``; a StartupError naming what is wrong with it."""
    fix = "give the URL `prime-coordinator start` logs as 'ledger API listening on' (--coordinator), or its -c config"
    try:
        response = httpx.get(url.rstrip("/") + routes.STATUS, timeout=timeout_s)
    except httpx.TransportError as exc:
        raise StartupError(f"cannot reach the coordinator at {url} ({type(exc).__name__})", fix) from exc
    try:
        response.raise_for_status()
        return RunStatus.model_validate_json(response.content)
    except (httpx.HTTPStatusError, pydantic.ValidationError) as exc:
        problem = f"{url} did not answer as a prime-network coordinator ({response.status_code})"
        raise StartupError(problem, fix) from exc


def show_status(url: str) -> None:
    """Print the run's status lines (`prime-coordinator status`)."""
    for line in describe_status(fetch_status(url)):
        print(line)


def status_url(config: CoordinatorConfig) -> str:
    """Where the API of the run ``config`` describes answers on this machine (the default of ``--coordinator``)."""
    return local_url(config.api.host, config.api.port)
