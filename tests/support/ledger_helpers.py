"""Test helpers for the ledger: a deterministic prompt source, configs, and well-formed submissions."""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from coordinator.config import CoordinatorConfig
from environments.prompts import SourcePrompt
from protocol.identity import NodeIdentity
from protocol.schemas import (
    FileEntry,
    Hardware,
    PolicyManifest,
    RegisterRequest,
    Rollout,
    ShardEntry,
    SignedManifest,
    SubmitRequest,
    Task,
)
from protocol.signing import sign_document
from runtime.config import load_config

TASK_NAME = "count"


class CountingPrompts:
    """The ledger's prompts in unit tests: group i of 'count' asks to count from i (deterministic, unbounded)."""

    name = TASK_NAME
    max_turns = 1
    shows_images = False

    def prompt_group(self, group_index: int, num_prompts: int) -> Sequence[SourcePrompt]:
        return [
            SourcePrompt(token_ids=(1, group_index % 1000 + 2, k + 2), text=f"count from {group_index}/{k}")
            for k in range(num_prompts)
        ]


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ledger_config(data_dir: Path, url: str = "", **overrides: Any) -> CoordinatorConfig:
    """A small, fast run config; ``overrides`` are keys such as ``scheduling__async_level`` (``__`` for ``.``)."""
    values: dict[str, Any] = {
        "data_dir": str(data_dir),
        "ledger.url": url,
        "scheduling.prompts_per_task": 2,
        "scheduling.group_size": 2,
        "scheduling.max_tokens": 8,
        "trust.validators_open": True,
        # In-process clients all come from 127.0.0.1: trusted, so tests of other rules see no Sybil limits
        # (the tests of those limits set sources.allow to []).
        "sources.allow": ["127.0.0.0/8"],
    }
    values.update({key.replace("__", "."): value for key, value in overrides.items()})
    return load_config(CoordinatorConfig, None, values)


def register_request(role: str = "worker") -> RegisterRequest:
    hardware = Hardware(accelerator="cpu", num_devices=1, memory_bytes=2**30)
    return RegisterRequest.model_validate(
        {"role": role, "hardware": hardware.model_dump(), "engine": "hf", "software_version": "test"}
    )


def rollouts_for(task: Task, length: int = 3) -> list[Rollout]:
    return [
        Rollout(
            prompt_index=prompt.prompt_index,
            sample_index=sample,
            completion_ids=[5 + sample] * length,
            logprobs=[-0.5] * length,
            finish_reason="stop",
            proof_b64="AAAA",
        )
        for prompt in task.prompts
        for sample in range(task.group_size)
    ]


def submission_for(task: Task, **changes: Any) -> SubmitRequest:
    values: dict[str, Any] = {
        "lease_id": task.lease_id,
        "task_id": task.task_id,
        "policy_version": task.policy_version,
        "engine": "hf",
        "rollouts": rollouts_for(task),
    }
    values.update(changes)
    return SubmitRequest(**values)


def signed_manifest(identity: NodeIdentity, version: int) -> SignedManifest:
    manifest = PolicyManifest(
        version=version,
        created_at=time.time(),
        hash_algorithm="sha256",
        shard_size_bytes=4,
        total_size_bytes=4,
        files=[FileEntry(path="model.safetensors", offset=0, size_bytes=4)],
        shards=[ShardEntry(index=0, offset=0, size_bytes=4, hash="ab" * 32)],
    )
    signature = sign_document(identity, manifest.model_dump(mode="json"))
    return SignedManifest(manifest=manifest, signer=identity.node_id, signature_b64=signature)


@contextmanager
def scratch_postgres_database(server_url: str) -> Iterator[str]:
    """A new database with a random name on the server of ``server_url``, dropped afterwards."""
    name = f"prime_ledger_test_{secrets.token_hex(6)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def new_postgres_schema(database_url: str) -> str:
    """The URL of a new, empty schema in that database (set as the connections' search_path)."""
    schema = f"t_{secrets.token_hex(6)}"
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    return make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)


def read_ledger(path: Path, statement: str) -> list[tuple[Any, ...]]:
    """The rows of ``statement`` on a running node's SQLite ledger at ``path``, opened read-only.

    Empty while the file does not exist yet or its tables are not made yet, so a harness can ask
    a ledger whose coordinator is still starting.
    """
    if not path.is_file():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return list(conn.execute(statement).fetchall())
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
