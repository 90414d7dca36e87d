"""`prime-worker status`: this node's standing with a coordinator, asked of its ledger: accepted, rejected, credit.

Read with the node's own key (from its data dir) from the ledger's public stats; nothing is registered or changed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from protocol.errors import PrimeError
from protocol.identity import load_or_create_identity
from protocol.ledger_client import LedgerClient
from runtime.cli import EXIT_BANNED, fail


async def print_standing(coordinator: str, data_dir: Path) -> int:
    """Print the run's line and this node's; the exit code: EXIT_BANNED for a banned node, else 0."""
    identity = load_or_create_identity(data_dir)
    async with LedgerClient(coordinator, identity) as ledger:
        stats = await ledger.stats(limit=10_000)
    run = stats.status
    typer.echo(f"run {run.run_name}: policy v{run.current_policy_version}, {run.num_workers_live} live workers")
    mine = next((node for node in stats.nodes if node.node_id == identity.node_id), None)
    if mine is None:
        typer.echo(f"node {identity.node_id} is not registered with this coordinator (or not seen recently)")
        return 0
    typer.echo(f"node {mine.node_id} ({mine.role}): {mine.num_accepted} accepted, {mine.num_rejected} rejected")
    if mine.role == "worker":
        credit = f"credit: {mine.credit_samples:,} verified samples ({mine.credit_tokens:,} tokens)"
        lost = f", {mine.credit_lost_samples:,} samples lost to caught cheating" if mine.credit_lost_samples else ""
        typer.echo(credit + lost)
    if mine.banned:
        typer.echo(f"banned: {mine.ban_reason}")
        return EXIT_BANNED
    return 0


def show_standing(coordinator: str, data_dir: Path) -> int:
    """`prime-worker status`: :func:`print_standing`, a failure one line and exit 1."""
    try:
        return asyncio.run(print_standing(coordinator, data_dir))
    except PrimeError as exc:
        fail(exc.message)
