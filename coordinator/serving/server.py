"""What an API process opens before it serves: the ledger database, the listening socket, the uvicorn server.

Each failure is a :class:`~protocol.errors.StartupError` naming the problem and its fix: a database
that cannot be reached or created, a port in use. ``prime-coordinator start`` (:mod:`coordinator.start`)
and ``start --api-only`` (:mod:`coordinator.serving.replica`) open the same way.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from coordinator.config import CoordinatorConfig
from coordinator.ledger.storage.engine import Database
from protocol.errors import StartupError

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from coordinator.ledger.ledger import Ledger
    from environments.prompts import PromptSource

LEDGER_URL_FIX = (
    "check ledger.url (--ledger-url or PRIME_COORDINATOR_LEDGER__URL): the database server must be running and its "
    "role and database must exist (PostgreSQL: createuser prime && createdb -O prime prime), or leave ledger.url "
    "empty for a SQLite file in the data dir"
)
SQLITE_URL_FIX = (
    "point ledger.url (--ledger-url) at a file in a directory this user may write, or leave it empty for "
    "ledger.db in the data dir"
)


def open_database(config: CoordinatorConfig) -> Database:
    """The run's ledger database; one that cannot be opened is a StartupError."""
    try:
        return Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StartupError(
            f"ledger.url {config.ledger_url!r} is not a database URL SQLAlchemy knows ({exc})", LEDGER_URL_FIX
        ) from exc
    except ModuleNotFoundError as exc:
        raise StartupError(
            f"the database driver {exc.name!r} for ledger.url is not installed", "pip install 'psycopg[binary]'"
        ) from exc
    except OSError as exc:
        raise StartupError(
            f"cannot create the ledger database file of {shown(config)}: {exc}", url_fix(config)
        ) from exc


def shown(config: CoordinatorConfig) -> str:
    """The ledger's URL without its credentials, for messages."""
    return config.ledger_url.split("@")[-1] if "@" in config.ledger_url else config.ledger_url


def url_fix(config: CoordinatorConfig) -> str:
    return SQLITE_URL_FIX if config.ledger_url.startswith("sqlite") else LEDGER_URL_FIX


def open_ledger(config: CoordinatorConfig, prompts: PromptSource, node_id: str) -> tuple[Database, Ledger]:
    """Open (and migrate) the run's ledger database; a database that cannot be used is a StartupError."""
    from sqlalchemy.exc import DBAPIError

    from coordinator.ledger.ledger import Ledger

    database = open_database(config)
    try:
        return database, Ledger(database, config, prompts, node_id)
    except OSError as exc:
        database.dispose()
        raise StartupError(f"cannot create the ledger database at {shown(config)}: {exc}", url_fix(config)) from exc
    except DBAPIError as exc:
        database.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        reason = reason.split("FATAL:")[-1].strip()
        raise StartupError(f"cannot open the ledger database at {shown(config)}: {reason}", url_fix(config)) from exc


def bind_api_socket(host: str, port: int) -> socket.socket:
    """The API's listening socket (bound here so port 0 works); a port in use is a StartupError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        problem = f"cannot listen on {host}:{port} for the ledger API: {exc.strerror}"
        if exc.errno == errno.EADDRINUSE:
            fix = "another program (perhaps another coordinator) uses that port: stop it, or pick another with --port"
        else:
            fix = "pick an address of this machine with --host (0.0.0.0 for all) and a free port with --port"
        raise StartupError(problem, fix) from exc
    return sock


def reachable_url(host: str, port: int, public_host: str | None) -> str:
    """The API's URL as another machine would dial it: the public host if set, this machine's name for a
    wildcard bind (0.0.0.0 is no address to dial), else the bound address."""
    if public_host:
        name = public_host
    elif host in ("0.0.0.0", "::", ""):
        name = socket.getfqdn()
    else:
        name = host
    return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"


def join_commands(url: str, coordinator_id: str) -> list[str]:
    """What the operator hands out: the commands that join this run, with its URL and the id to pin."""
    return [
        f"dashboard: {url}/dashboard",
        f"workers join with:    prime-worker join --coordinator {url} --gpu all",
        f"validators run:       prime-validator run --coordinator {url}  (approve their node ids first)",
        f"relays mirror it:     prime-relay serve --upstream {url}/shardcast --coordinator-id {coordinator_id}",
    ]


def api_server(app: FastAPI) -> uvicorn.Server:
    """The uvicorn server of the ledger API ``app``; its waiting long-polls end when it shuts down."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=5,
            backlog=4096,
            proxy_headers=False,  # X-Forwarded-For only from sources.trusted_proxies (see coordinator.serving.app)
        )
    )
    app.state.long_polls.closing = lambda: bool(server.should_exit)
    return server
