"""Export of trained data: every rollout of the steps A..B, with its reward and verdict, as Parquet or JSONL.

``prime-coordinator export --steps A:B --format parquet --out FILE`` writes one row per rollout
of each recorded step in the range, in step and batch order: the step, the submission (id,
worker node, policy version, engine, task), the prompt's token ids (from the ledger's task, not
from the worker), the completion's token ids, the worker's logprobs, its finish reason, the
validator's reward and the group advantage the trainer learned from, and the verdict (who, when,
reasons). Bodies already moved to the archive (:mod:`coordinator.ledger.archive`) are read from there.
The rows are those :func:`coordinator.ledger.batches.train_samples` builds the step's batch from, every one of
them: groups without reward spread (advantage 0), which the trainer is not given, included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select

from coordinator.config import CoordinatorConfig
from coordinator.ledger.archive import ARCHIVED_BODY, archived_bodies
from coordinator.ledger.batches import BatchRules, accepted_group, scored_rollouts
from coordinator.ledger.storage.engine import Database
from coordinator.ledger.storage.tables import step_submissions, submissions, tasks, train_steps
from protocol.errors import ConfigError

ExportFormat = Literal["parquet", "jsonl"]
ROW_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("step_state", pa.string()),
        ("submission_id", pa.string()),
        ("node_id", pa.string()),
        ("policy_version", pa.int64()),
        ("engine", pa.string()),
        ("task_id", pa.string()),
        ("task_name", pa.string()),
        ("prompt_index", pa.int64()),
        ("sample_index", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float64())),
        ("finish_reason", pa.string()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("accepted", pa.bool_()),
        ("verdict_by", pa.string()),
        ("verdict_at", pa.float64()),
        ("verdict_reasons", pa.list_(pa.string())),
    ]
)
_BATCH_ROWS = 4096


def parse_steps(text: str) -> tuple[int, int]:
    """``A:B`` (inclusive), ``A:`` (to the last) or ``N`` (one step) as (first, last); last -1 means open."""
    first, sep, last = text.partition(":")
    try:
        start = int(first) if first else 1
        end = (int(last) if last else -1) if sep else start
    except ValueError:
        raise ConfigError(f"--steps {text!r}: expected A:B, A: or N (step numbers)") from None
    if start < 1 or (end != -1 and end < start):
        raise ConfigError(f"--steps {text!r}: steps start at 1 and the range must not be empty")
    return start, end


def rollout_rows(
    db: Database, first: int, last: int, archive_dir: Path, normalize_std: bool
) -> Iterator[dict[str, Any]]:
    """The export's rows for steps ``first``..``last`` (-1: the newest), in step and batch order."""
    query = (
        select(
            step_submissions.c.step,
            train_steps.c.state,
            submissions.c.submission_id,
            submissions.c.node_id,
            submissions.c.policy_version,
            submissions.c.task_id,
            submissions.c.body_json,
            submissions.c.verdict_json,
            submissions.c.verdict_by,
            submissions.c.verdict_at,
            tasks.c.task_name,
            tasks.c.prompts_json,
        )
        .join(submissions, submissions.c.submission_id == step_submissions.c.submission_id)
        .join(tasks, tasks.c.task_id == submissions.c.task_id)
        .join(train_steps, train_steps.c.step == step_submissions.c.step)
        .where(step_submissions.c.step >= first)
        .order_by(step_submissions.c.step, step_submissions.c.position)
    )
    if last != -1:
        query = query.where(step_submissions.c.step <= last)
    with db.read() as conn:
        found = conn.execute(query).all()
    bodies = archived_bodies(archive_dir, [r.submission_id for r in found if r.body_json == ARCHIVED_BODY])
    for r in found:
        body = bodies.get(r.submission_id) if r.body_json == ARCHIVED_BODY else r.body_json
        if body is None:
            raise ConfigError(f"the body of submission {r.submission_id} is archived but not in {archive_dir}")
        group = accepted_group(r.submission_id, r.policy_version, r.prompts_json, body, r.verdict_json)
        verdict = json.loads(r.verdict_json)
        for rollout, reward, advantage in scored_rollouts(group, BatchRules(normalize_std=normalize_std)):
            yield {
                "step": r.step,
                "step_state": r.state,
                "submission_id": r.submission_id,
                "node_id": r.node_id,
                "policy_version": r.policy_version,
                "engine": group.submission.engine,
                "task_id": r.task_id,
                "task_name": r.task_name,
                "prompt_index": rollout.prompt_index,
                "sample_index": rollout.sample_index,
                "prompt_ids": group.prompt_token_ids[rollout.prompt_index],
                "completion_ids": list(rollout.completion_ids),
                "logprobs": list(rollout.logprobs),
                "finish_reason": rollout.finish_reason,
                "reward": reward,
                "advantage": advantage,
                "accepted": bool(verdict.get("accepted", True)),
                "verdict_by": r.verdict_by,
                "verdict_at": r.verdict_at,
                "verdict_reasons": list(verdict.get("reasons", [])),
            }


def export_rollouts(
    db: Database, steps: str, fmt: ExportFormat, out: Path, archive_dir: Path, normalize_std: bool = False
) -> int:
    """Write the rows of ``steps`` (``A:B``) to ``out`` in ``fmt``; returns the number of rows."""
    first, last = parse_steps(steps)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    count = 0
    rows = rollout_rows(db, first, last, archive_dir, normalize_std)
    try:
        if fmt == "jsonl":
            with tmp.open("w") as handle:
                for row in rows:
                    handle.write(json.dumps(row, separators=(",", ":")) + "\n")
                    count += 1
        else:
            with pq.ParquetWriter(tmp, ROW_SCHEMA, compression="zstd") as writer:
                chunk: list[dict[str, Any]] = []
                for row in rows:
                    chunk.append(row)
                    if len(chunk) == _BATCH_ROWS:
                        writer.write_table(pa.Table.from_pylist(chunk, schema=ROW_SCHEMA))
                        count, chunk = count + len(chunk), []
                if chunk:
                    writer.write_table(pa.Table.from_pylist(chunk, schema=ROW_SCHEMA))
                    count += len(chunk)
        if count == 0:
            raise ConfigError(f"--steps {steps}: no recorded training step in that range")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def export_from_cli(config: CoordinatorConfig, steps: str, fmt: ExportFormat, out: Path) -> None:
    """`prime-coordinator export`: write the rollouts of ``steps`` to ``out``."""
    from coordinator.ledger.archive import open_existing

    db = open_existing(config)
    try:
        count = export_rollouts(db, steps, fmt, out, config.archive_dir, config.orchestrator.normalize_std)
    finally:
        db.dispose()
    print(f"exported {count} rollouts of steps {steps} to {out} ({fmt})")
