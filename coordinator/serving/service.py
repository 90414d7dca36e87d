"""`prime-coordinator start`: open the run's ledger and serve its API with uvicorn until stopped.

Creates (or loads) the coordinator's node key in the data dir, opens and migrates the ledger
database, loads the environment, binds the API socket itself (so port 0 works and the real
address can be logged before serving) and runs uvicorn on it. The SHARDCAST origin is mounted
at /shardcast; on the first start the configured start checkpoint is published as policy
version 0. With ``validation.builtin_enabled`` a validator child runs alongside
(:mod:`coordinator.processes.builtin_validator`). With `[orchestrator]` and/or `[local_network]` enabled, a
:class:`coordinator.loop.runner.RunThread` beside the server runs the RL loop, its trainer service
and the local network; the server exits when the run is done.
"""

from __future__ import annotations

import errno
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.config import CoordinatorConfig
from protocol.errors import StartupError

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from coordinator.ledger.ledger import Ledger
    from coordinator.ledger.ownership import LedgerLock
    from coordinator.ledger.storage.engine import Database
    from environments.prompts import PromptSource

log = logging.getLogger("coordinator")
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
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from coordinator.ledger.storage.engine import Database

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


def run(config: CoordinatorConfig) -> None:
    from coordinator.ledger.run_spec import check_precision
    from coordinator.loop.tracking import check_tracking
    from runtime.data_dir_lock import hold_data_dir

    precision = check_precision(config)  # before anything is created: a run its validators cannot audit stops here
    if config.orchestrator.enabled:
        check_tracking(config.orchestrator.tracking)  # a missing tensorboard or wandb package: one line, no run
    with hold_data_dir(config.data_dir, "prime-coordinator"):  # one coordinator per run directory
        serve_run(config, precision)


def serve_run(config: CoordinatorConfig, precision: str) -> None:
    """Open the run's ledger, publish v0 on the first start, and serve until the run ends or is stopped."""
    from coordinator.ledger.ownership import check_owner, hold_ledger
    from coordinator.ledger.replay import DatabaseReplayCache
    from coordinator.ledger.run_record import record_run
    from coordinator.ledger.run_spec import environment_prompts, signed_run_spec
    from coordinator.loop.policies import (
        policy_store,
        publish_policy,
        published_version,
        with_vocab_size,
        without_links,
    )
    from coordinator.processes.builtin_validator import BuiltinValidator, approve_builtin_validator, local_url
    from coordinator.serving.app import create_app
    from coordinator.serving.dashboard.relays import RelayWatch
    from coordinator.serving.p2p import start_coordinator_gossip
    from protocol.identity import key_path, load_or_create_identity
    from shardcast.origin import OriginSource
    from shardcast.server import create_app as create_shardcast_app
    from trainer.resolve import resolve_model_path

    identity = load_or_create_identity(config.data_dir)
    log.info("coordinator node id %s (key %s)", identity.node_id, key_path(config.data_dir))
    log.info("run precision %s (workers generate and validators recompute in it)", precision)
    config = approve_builtin_validator(config)
    start = resolve_model_path(config.policy.start_checkpoint)
    config = with_vocab_size(config, start)
    builtin_validator = BuiltinValidator(config, identity.node_id)
    prompts = environment_prompts(config)
    run_spec = signed_run_spec(config, identity, prompts.max_turns)
    environment = run_spec.spec.environment
    log.info(
        "environment %s %r (%s %s, hash %s)",
        environment.kind,
        environment.name,
        environment.package,
        environment.package_version,
        environment.config_hash[:12],
    )
    database, ledger = open_ledger(config, prompts, identity.node_id)
    ledger_lock: LedgerLock | None = None
    try:
        ledger_lock = hold_ledger(database)  # one coordinator per run, whatever data dir the other one has
        check_owner(ledger, identity.node_id, config.data_dir)
        record_run(database, run_spec, config)  # what API replicas serve and lease by
        ledger.share_changes()  # PostgreSQL: API replicas' writes wake this process's long-polls, and ours theirs
        status = ledger.status()
        log.info(
            "ledger %s: run %r, policy version %d, %d submission(s) accepted",
            database.engine.url.render_as_string(hide_password=True),
            status.run_name,
            status.current_policy_version,
            status.num_submissions_accepted,
        )
        relays = RelayWatch()
        app = create_app(config, ledger, DatabaseReplayCache(database), relays, run_spec)
        store = policy_store(config)
        if store.clear_leftovers_if_idle():  # what a publish killed mid-write left in the store's staging
            log.debug("origin store %s: leftovers of interrupted publishes cleared", store.root)
        if published_version(ledger) is None:
            log.info("publishing the start checkpoint %s as policy v0", start)
            published = without_links(start, config.data_dir / "start-checkpoint")
            publish_policy(published, 0, identity, store, ledger, config)
        app.mount("/shardcast", create_shardcast_app(OriginSource(store)))
        sock = bind_api_socket(config.api.host, config.api.port)
        host, port = sock.getsockname()[:2]
        log.info("ledger API listening on http://%s:%d (OpenAPI at /docs)", host, port)
        url_host = f"[{host}]" if sock.family == socket.AF_INET6 else host
        if not config.local_network.enabled:  # the demo's nodes are its own children
            for line in join_commands(reachable_url(host, port, config.p2p.public_host), identity.node_id):
                log.info("%s", line)
        gossip = start_coordinator_gossip(
            identity, config, ledger, app, f"http://{url_host}:{port}", relays.on_announcement
        )
        if gossip is not None:
            relays.start()  # asks the relays heard on gossip what they hold, for the dashboard
        server = api_server(app)
        if config.validation.builtin_enabled:
            builtin_validator.start(local_url(host, port))
        runner = None
        if config.orchestrator.enabled or config.local_network.enabled:
            from coordinator.loop.runner import RunThread

            runner = RunThread(config, ledger, identity, store, server, f"http://{host}:{port}")
            runner.start()
        try:
            server.run(sockets=[sock])
        finally:
            if runner is not None:
                runner.finish()
            if gossip is not None:
                gossip.stop()
            relays.stop()
    finally:
        builtin_validator.stop()
        ledger.stop_sharing_changes()
        if ledger_lock is not None:
            ledger_lock.release()
        database.dispose()


def publish_from_cli(config: CoordinatorConfig, checkpoint: Path, version: int | None) -> None:
    """`prime-coordinator publish`: the same publication the orchestrator makes, from a shell."""
    from coordinator.loop.policies import policy_store, publish_policy, published_version
    from environments.prompts import NoPrompts
    from protocol.identity import load_or_create_identity

    identity = load_or_create_identity(config.data_dir)
    database, ledger = open_ledger(config, NoPrompts(), identity.node_id)
    try:
        current = published_version(ledger)
        chosen = version if version is not None else (0 if current is None else current + 1)
        signed = publish_policy(checkpoint, chosen, identity, policy_store(config), ledger, config)
        print(f"published policy v{signed.manifest.version} from {checkpoint}")
    finally:
        database.dispose()


def reset_run(config: CoordinatorConfig, assume_yes: bool) -> None:
    """`prime-coordinator reset`: drop the run's ledger tables and delete its data dir, after saying what goes."""
    import shutil

    import typer
    from sqlalchemy.exc import DBAPIError

    from coordinator.ledger.ownership import drop_ledger, hold_ledger, ledger_tables, shown_url
    from coordinator.ledger.storage.engine import Database
    from runtime.data_dir_lock import hold_data_dir

    data_dir = config.data_dir
    with hold_data_dir(data_dir, "prime-coordinator reset"):  # refused while a coordinator runs on it
        try:
            database = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
        except Exception as exc:
            raise StartupError(f"cannot open the ledger database {config.ledger_url!r}: {exc}", LEDGER_URL_FIX) from exc
        try:
            with hold_ledger(database):
                tables = ledger_tables(database)
                print(f"ledger {shown_url(database)}: " + (f"{len(tables)} table(s) to drop" if tables else "empty"))
                print(f"data dir {data_dir.resolve()}: to delete")
                if not assume_yes and not typer.confirm("delete the run and start over?", default=False):
                    print("nothing deleted")
                    return
                drop_ledger(database)
        except DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
            raise StartupError(f"cannot reset the ledger at {shown_url(database)}: {reason}", LEDGER_URL_FIX) from exc
        finally:
            database.dispose()
        for child in data_dir.iterdir():  # the directory itself holds our lock until we are done
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    print(f"the run is reset: `prime-coordinator start` with the same config begins again at step 0 in {data_dir}")
