"""What the coordinator records in the ledger for its API replicas: the signed run spec and the shared settings.

Several API processes may serve one run from one PostgreSQL ledger (``prime-coordinator start
--api-only`` behind a load balancer). Only the coordinator holds the run's key, so at each start it
records the run spec it signed, and the settings that decide how tasks are leased, whom the run
trusts, what a source may do and how verdicts count (:data:`SHARED_SECTIONS`). A replica serves that
spec and takes those settings from the ledger rather than from its own file, so the processes of one
run never disagree on a rule; from its file it takes only where to listen and what it needs to
render prompts (the environment and the start checkpoint's tokenizer), which must give the spec's
environment.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, update

from coordinator.config import CoordinatorConfig
from coordinator.ledger.core import RUN_ROW_ID
from coordinator.ledger.ownership import shown_url
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.migrations import LATEST_VERSION, current_version
from coordinator.ledger.storage.tables import run_state
from protocol.errors import BadSignatureError, StartupError
from protocol.schemas import SignedRunSpec
from protocol.signing import verify_document

SHARED_SECTIONS = ("scheduling", "trust", "sources", "validation")
"""The config sections every API process of one run takes from the coordinator."""
START_COORDINATOR_FIRST = "start the run's coordinator (`prime-coordinator start` without --api-only) first"


def shared_settings(config: CoordinatorConfig) -> dict[str, Any]:
    return {name: getattr(config, name).model_dump(mode="json") for name in SHARED_SECTIONS}


def record_run(database: Database, signed: SignedRunSpec, config: CoordinatorConfig) -> None:
    """The coordinator's record of its run spec and shared settings (the run row exists: the ledger made it)."""
    with database.write() as conn:
        conn.execute(
            update(run_state)
            .where(run_state.c.id == RUN_ROW_ID)
            .values(
                run_spec_json=signed.model_dump_json(),
                api_settings_json=json.dumps(shared_settings(config), sort_keys=True),
            )
        )


def recorded_run(database: Database, config: CoordinatorConfig) -> tuple[SignedRunSpec, CoordinatorConfig]:
    """The coordinator's signed run spec, and ``config`` with the coordinator's shared settings; a StartupError
    when no coordinator has recorded the run, or the record is not one a coordinator signed."""
    with database.read() as conn:
        version = current_version(conn)
        row = conn.execute(select(run_state)).first() if version >= LATEST_VERSION else None
    if row is None or row.run_spec_json is None:
        raise StartupError(
            f"no coordinator has started a run on the ledger {shown_url(database)}", START_COORDINATOR_FIRST
        )
    signed = SignedRunSpec.model_validate_json(row.run_spec_json)
    try:
        verify_document(signed.signer, signed.spec.model_dump(mode="json"), signed.signature_b64)
    except BadSignatureError as exc:
        raise StartupError(
            f"the run spec recorded in {shown_url(database)} is not signed: {exc.message}", START_COORDINATOR_FIRST
        ) from exc
    if signed.spec.run_name != config.run_name:
        raise StartupError(
            f"the ledger holds run {signed.spec.run_name!r}, this config names {config.run_name!r}",
            "give the replica the coordinator's run_name and ledger.url",
        )
    sections = json.loads(row.api_settings_json)
    shared = {name: type(getattr(config, name)).model_validate(sections[name]) for name in SHARED_SECTIONS}
    return signed, config.model_copy(update=shared)
