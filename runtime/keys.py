"""`<cmd> keys show` and `keys create`: print a node's Ed25519 identity, the one in its data dir.

Every role's console script has these two commands (:func:`runtime.cli.make_keys_app` declares them and
turns an error here into its one line); this module does their work, so that ``--help`` does not load the
cryptography behind :mod:`protocol.identity`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from protocol.errors import IdentityError
from protocol.identity import key_path, load_identity, load_or_create_identity


def show_key(directory: Path, script: str, id_only: bool) -> None:
    """Print the node id (alone with ``id_only``) and key file of the key in ``directory``; an IdentityError
    saying how to make one when there is none (``show`` never creates one)."""
    path = key_path(directory)
    if not path.exists():
        raise IdentityError(
            f"no node key in {directory}; `{script} keys create --data-dir {directory}` makes one "
            "(the node's first start does too), or point --data-dir / -c at the node's data dir"
        )
    identity = load_identity(path)
    if id_only:
        typer.echo(identity.node_id)
        return
    typer.echo(f"node id:  {identity.node_id}")
    typer.echo(f"key file: {path}")


def create_key(directory: Path) -> None:
    """Create the node key in ``directory`` (0600) if there is none, and print the node id and key file."""
    identity = load_or_create_identity(directory)
    typer.echo(f"node id:  {identity.node_id}")
    typer.echo(f"key file: {key_path(directory)}")
