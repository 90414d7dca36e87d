"""`prime-coordinator start`: open the run's ledger and serve its API with uvicorn until stopped.

Creates (or loads) the coordinator's node key in the data dir, opens and migrates the ledger
database, loads the task source, binds the API socket itself (so port 0 works and the real
address can be logged before serving) and runs uvicorn on it. The SHARDCAST origin is mounted
at /shardcast; on the first start the configured start checkpoint is published as policy
version 0. With ``validation.builtin_enabled`` a validator child runs alongside
(:mod:`coordinator.builtin_validator`). With `[orchestrator]` and/or `[local_network]` enabled, a
:class:`coordinator.runner.RunThread` beside the server runs the RL loop, its trainer service
and the local network; the server exits when the run is done.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from coordinator.config import CoordinatorConfig

log = logging.getLogger("coordinator")


def run(config: CoordinatorConfig) -> None:
    import uvicorn

    from coordinator.api.app import create_app
    from coordinator.builtin_validator import BuiltinValidator, approve_builtin_validator, local_url
    from coordinator.dashboard.relays import RelayWatch
    from coordinator.ledger import Ledger
    from coordinator.p2p import start_coordinator_gossip
    from coordinator.policies import policy_store, publish_policy, published_version
    from coordinator.replay import DatabaseReplayCache
    from coordinator.run_spec import environment_prompts, signed_run_spec
    from coordinator.storage.engine import Database
    from protocol.identity import key_path, load_or_create_identity
    from shardcast.origin import OriginSource
    from shardcast.server import create_app as create_shardcast_app
    from trainer.builtin import resolve_model_path

    identity = load_or_create_identity(config.data_dir)
    log.info("coordinator node id %s (key %s)", identity.node_id, key_path(config.data_dir))
    config = approve_builtin_validator(config)
    builtin_validator = BuiltinValidator(config, identity.node_id)
    prompts = environment_prompts(config)
    run_spec = signed_run_spec(config, identity)
    environment = run_spec.spec.environment
    log.info(
        "environment %s %r (%s %s, hash %s)",
        environment.kind,
        environment.name,
        environment.package,
        environment.package_version,
        environment.config_hash[:12],
    )
    database = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
    try:
        ledger = Ledger(database, config, prompts, identity.node_id)
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
        if published_version(ledger) is None:
            start = resolve_model_path(config.policy.start_checkpoint)
            log.info("publishing the start checkpoint %s as policy v0", start)
            publish_policy(start, 0, identity, store, ledger, config)
        app.mount("/shardcast", create_shardcast_app(OriginSource(store)))
        family = socket.AF_INET6 if ":" in config.api.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.api.host, config.api.port))
        host, port = sock.getsockname()[:2]
        log.info("ledger API listening on http://%s:%d (OpenAPI at /docs)", host, port)
        url_host = f"[{host}]" if family == socket.AF_INET6 else host
        gossip = start_coordinator_gossip(
            identity, config, ledger, app, f"http://{url_host}:{port}", relays.on_announcement
        )
        if gossip is not None:
            relays.start()  # asks the relays heard on gossip what they hold, for the dashboard
        server = uvicorn.Server(
            uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5, backlog=4096)
        )
        if config.validation.builtin_enabled:
            builtin_validator.start(local_url(host, port))
        runner = None
        if config.orchestrator.enabled or config.local_network.enabled:
            from coordinator.runner import RunThread

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
        database.dispose()


def publish_from_cli(config: CoordinatorConfig, checkpoint: Path, version: int | None) -> None:
    """`prime-coordinator publish`: the same publication the orchestrator makes, from a shell."""
    from coordinator.ledger import Ledger
    from coordinator.policies import policy_store, publish_policy, published_version
    from coordinator.storage.engine import Database
    from environments.prompts import NoPrompts
    from protocol.identity import load_or_create_identity

    identity = load_or_create_identity(config.data_dir)
    database = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
    try:
        ledger = Ledger(database, config, NoPrompts(), identity.node_id)
        current = published_version(ledger)
        chosen = version if version is not None else (0 if current is None else current + 1)
        signed = publish_policy(checkpoint, chosen, identity, policy_store(config), ledger, config)
        print(f"published policy v{signed.manifest.version} from {checkpoint}")
    finally:
        database.dispose()
