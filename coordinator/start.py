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

import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ownership import check_owner, hold_ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.run_record import record_run
from coordinator.ledger.run_spec import check_precision, environment_prompts, signed_run_spec
from coordinator.loop.policies import policy_store, publish_policy, published_version, with_vocab_size, without_links
from coordinator.loop.runner import RunThread
from coordinator.loop.tracking import check_tracking
from coordinator.processes.builtin_validator import BuiltinValidator, approve_builtin_validator, local_url
from coordinator.serving.app import create_app
from coordinator.serving.dashboard.relays import RelayWatch
from coordinator.serving.p2p import start_coordinator_gossip
from coordinator.serving.server import api_server, bind_api_socket, join_commands, open_ledger, reachable_url
from protocol.identity import NodeIdentity, key_path, load_or_create_identity
from runtime.data_dir_lock import hold_data_dir
from shardcast.http.server import create_app as create_shardcast_app
from shardcast.origin.publish import OriginSource
from trainer.resolve import resolve_model_path

if TYPE_CHECKING:
    from pathlib import Path

    from fastapi import FastAPI

    from coordinator.ledger.ledger import Ledger
    from environments.prompts import PromptSource
    from protocol.schemas import SignedRunSpec
    from shardcast.format.store import VersionStore

log = logging.getLogger("coordinator")


def run(config: CoordinatorConfig) -> None:
    """Check what a run needs before anything is created, then serve it while holding its data dir."""
    precision = check_precision(config)  # before anything is created: a run its validators cannot audit stops here
    if config.orchestrator.enabled:
        check_tracking(config.orchestrator.tracking)  # a missing tensorboard or wandb package: one line, no run
    with hold_data_dir(config.data_dir, "prime-coordinator"):  # one coordinator per run directory
        serve_run(config, precision)


@dataclass(frozen=True)
class RunSetup:
    """What the coordinator settles before it opens the ledger: its key, the final config, the start checkpoint,
    the environment's prompts, the signed run spec and the built-in validator."""

    identity: NodeIdentity
    config: CoordinatorConfig
    start_checkpoint: Path
    prompts: PromptSource
    run_spec: SignedRunSpec
    builtin_validator: BuiltinValidator


def set_up(config: CoordinatorConfig, precision: str) -> RunSetup:
    """The node key, the start checkpoint (its vocabulary size in the config), the environment's prompts and the
    signed run spec; each logged."""
    identity = load_or_create_identity(config.data_dir)
    log.info("coordinator node id %s (key %s)", identity.node_id, key_path(config.data_dir))
    log.info("run precision %s (workers generate and validators recompute in it)", precision)
    config = approve_builtin_validator(config)
    start = resolve_model_path(config.policy.start_checkpoint)
    config = with_vocab_size(config, start)
    builtin_validator = BuiltinValidator(config, identity.node_id)
    prompts = environment_prompts(config)
    run_spec = signed_run_spec(config, identity, prompts)
    environment = run_spec.spec.environment
    log.info(
        "environment %s %r (%s %s, hash %s)",
        environment.kind,
        environment.name,
        environment.package,
        environment.package_version,
        environment.config_hash[:12],
    )
    return RunSetup(identity, config, start, prompts, run_spec, builtin_validator)


def serve_run(config: CoordinatorConfig, precision: str) -> None:
    """Open the run's ledger, publish v0 on the first start, and serve until the run ends or is stopped."""
    setup = set_up(config, precision)
    database, ledger = open_ledger(setup.config, setup.prompts, setup.identity.node_id)
    ledger_lock = None
    try:
        ledger_lock = hold_ledger(database)  # one coordinator per run, whatever data dir the other one has
        check_owner(ledger, setup.identity.node_id, setup.config.data_dir)
        record_run(database, setup.run_spec, setup.config)  # what API replicas serve and lease by
        ledger.share_changes()  # PostgreSQL: API replicas' writes wake this process's long-polls, and ours theirs
        status = ledger.status()
        log.info(
            "ledger %s: run %r, policy version %d, %d submission(s) accepted",
            database.engine.url.render_as_string(hide_password=True),
            status.run_name,
            status.current_policy_version,
            status.num_submissions_accepted,
        )
        serve(setup, ledger, DatabaseReplayCache(database))
    finally:
        setup.builtin_validator.stop()
        ledger.stop_sharing_changes()
        if ledger_lock is not None:
            ledger_lock.release()
        database.dispose()


def origin_store(setup: RunSetup, ledger: Ledger) -> VersionStore:
    """The SHARDCAST origin's store, with policy v0 published into it on the first start."""
    config = setup.config
    store = policy_store(config)
    if store.clear_leftovers_if_idle():  # what a publish killed mid-write left in the store's staging
        log.debug("origin store %s: leftovers of interrupted publishes cleared", store.root)
    if published_version(ledger) is None:
        log.info("publishing the start checkpoint %s as policy v0", setup.start_checkpoint)
        published = without_links(setup.start_checkpoint, config.data_dir / "start-checkpoint")
        publish_policy(published, 0, setup.identity, store, ledger, config)
    return store


def serve(setup: RunSetup, ledger: Ledger, replay_cache: DatabaseReplayCache) -> None:
    """Serve the ledger API and the origin on the configured address, with gossip, the built-in validator and the
    run loop beside the server, until the server exits; then stop what was started."""
    config = setup.config
    relays = RelayWatch()
    app: FastAPI = create_app(config, ledger, replay_cache, relays, setup.run_spec)
    store = origin_store(setup, ledger)
    app.mount("/shardcast", create_shardcast_app(OriginSource(store)))
    sock = bind_api_socket(config.api.host, config.api.port)
    host, port = sock.getsockname()[:2]
    log.info("ledger API listening on http://%s:%d (OpenAPI at /docs)", host, port)
    url_host = f"[{host}]" if sock.family == socket.AF_INET6 else host
    if not config.local_network.enabled:  # the demo's nodes are its own children
        for line in join_commands(reachable_url(host, port, config.p2p.public_host), setup.identity.node_id):
            log.info("%s", line)
    gossip = start_coordinator_gossip(
        setup.identity, config, ledger.views, app, f"http://{url_host}:{port}", relays.on_announcement
    )
    if gossip is not None:
        relays.start()  # asks the relays heard on gossip what they hold, for the dashboard
    server = api_server(app)
    if config.validation.builtin_enabled:
        setup.builtin_validator.start(local_url(host, port))
    runner = None
    if config.orchestrator.enabled or config.local_network.enabled:
        runner = RunThread(config, ledger, setup.identity, store, server, f"http://{host}:{port}")
        runner.start()
    try:
        server.run(sockets=[sock])
    finally:
        if runner is not None:
            runner.finish()
        if gossip is not None:
            gossip.stop()
        relays.stop()
