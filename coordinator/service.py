"""`prime-coordinator start`: open the run's ledger and serve its API with uvicorn until stopped.

Creates (or loads) the coordinator's node key in the data dir, opens and migrates the ledger
database, loads the task source, binds the API socket itself (so port 0 works and the real
address can be logged before serving) and runs uvicorn on it. The orchestrator, trainer and
SHARDCAST origin join this process with the demo network (issue 9).
"""

from __future__ import annotations

import logging
import socket

from coordinator.config import CoordinatorConfig

log = logging.getLogger("coordinator")


def run(config: CoordinatorConfig) -> None:
    import uvicorn

    from coordinator.api.app import create_app
    from coordinator.ledger import Ledger
    from coordinator.replay import DatabaseReplayCache
    from coordinator.storage.engine import Database
    from coordinator.task_source import EmptyTaskSource, load_task_source
    from protocol.identity import key_path, load_or_create_identity

    identity = load_or_create_identity(config.data_dir)
    log.info("coordinator node id %s (key %s)", identity.node_id, key_path(config.data_dir))
    task_source = load_task_source(config.task_source)
    if isinstance(task_source, EmptyTaskSource):
        log.warning("no task_source configured: the ledger runs but hands out no tasks until one is wired")
    database = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
    try:
        ledger = Ledger(database, config, task_source, identity.node_id)
        status = ledger.status()
        log.info(
            "ledger %s: run %r, policy version %d, %d submission(s) accepted",
            database.engine.url.render_as_string(hide_password=True),
            status.run_name,
            status.current_policy_version,
            status.num_submissions_accepted,
        )
        app = create_app(config, ledger, DatabaseReplayCache(database))
        family = socket.AF_INET6 if ":" in config.api.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.api.host, config.api.port))
        host, port = sock.getsockname()[:2]
        log.info("ledger API listening on http://%s:%d (OpenAPI at /docs)", host, port)
        server = uvicorn.Server(
            uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5, backlog=4096)
        )
        server.run(sockets=[sock])
    finally:
        database.dispose()
