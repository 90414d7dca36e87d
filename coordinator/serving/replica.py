"""`prime-coordinator start --api-only`: one more ledger API process for a run on PostgreSQL.

An API replica serves the same routes as the coordinator from the same PostgreSQL ledger, and
nothing else: no orchestrator, trainer, SHARDCAST origin, gossip node or built-in validator, and no
key (it cannot sign or publish). It serves the run spec the coordinator recorded and takes the
coordinator's shared settings from the ledger (:mod:`coordinator.ledger.run_record`); its own
config gives where it listens, the ledger's URL, and the environment and start checkpoint it renders
prompts with, which must match the run spec. Leases, nonces and verdicts are decided in the
database, and the change feed wakes its long-polls on the other processes' writes. A load balancer
(``deploy/haproxy.cfg``) spreads the API over the coordinator and its replicas and sends
``/shardcast`` to the coordinator. docs/operator.md, "API replicas", says how to run them.
"""

from __future__ import annotations

import logging

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ledger import Ledger
from coordinator.ledger.replay import DatabaseReplayCache
from coordinator.ledger.run_record import START_COORDINATOR_FIRST, recorded_run
from coordinator.ledger.run_spec import environment_prompts
from coordinator.serving.app import create_app
from coordinator.serving.dashboard.relays import RelayWatch
from coordinator.serving.server import api_server, bind_api_socket, open_database
from environments.loader import environment_identity
from protocol.errors import StartupError

log = logging.getLogger("coordinator")


def run_api_replica(config: CoordinatorConfig) -> None:
    """Serve the ledger API of the run the coordinator recorded in ``config``'s PostgreSQL ledger until stopped."""
    if not config.ledger_url.startswith("postgresql"):
        raise StartupError(
            "an API replica shares the coordinator's PostgreSQL ledger, and ledger.url is not PostgreSQL",
            "set ledger.url (--ledger-url) to the coordinator's; on SQLite a run has one API process",
        )
    database = open_database(config)
    ledger: Ledger | None = None
    try:
        signed, config = recorded_run(database, config)
        if environment_identity(config.environment) != signed.spec.environment:
            raise StartupError(
                f"this config's [environment] is not the run's ({signed.spec.environment.name!r}, "
                f"hash {signed.spec.environment.config_hash[:12]})",
                f"give the replica the coordinator's [environment] section; {START_COORDINATOR_FIRST} if it changed",
            )
        ledger = Ledger(database, config, environment_prompts(config), signed.signer)
        ledger.share_changes()
        app = create_app(config, ledger, DatabaseReplayCache(database), RelayWatch(), signed)
        sock = bind_api_socket(config.api.host, config.api.port)
        host, port = sock.getsockname()[:2]
        log.info(
            "ledger API replica of run %r (coordinator %s) listening on http://%s:%d",
            signed.spec.run_name,
            signed.signer,
            host,
            port,
        )
        api_server(app).run(sockets=[sock])
    finally:
        if ledger is not None:
            ledger.stop_sharing_changes()
        database.dispose()
