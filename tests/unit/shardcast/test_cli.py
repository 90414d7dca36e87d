"""`prime-relay publish` and `prime-relay fetch` argument handling (the servers run in integration tests)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from protocol.identity import load_or_create_identity
from runtime.cli import EXIT_BAD_CONFIG
from shardcast.cli import app
from shardcast.format.manifest import load_verified_manifest
from shardcast.format.store import VersionStore


def test_publish_signs_with_the_key_in_key_dir(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"\1" * 10_000)
    args = ["publish", str(checkpoint), "--version", "4", "--store", str(tmp_path / "store")]
    args += ["--key-dir", str(tmp_path / "keys"), "--shard-size-bytes", "4096", "--no-fsync", "--copy"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    coordinator_id = load_or_create_identity(tmp_path / "keys").node_id
    assert summary == {"version": 4, "signer": coordinator_id, "num_shards": 3, "total_bytes": 10_000}
    store = VersionStore(tmp_path / "store")
    load_verified_manifest(store.manifest_path(4).read_bytes(), coordinator_id, 4)
    stored = store.version_dir(4) / "files" / "model.safetensors"
    assert stored.stat().st_ino != (checkpoint / "model.safetensors").stat().st_ino  # --copy: not a link
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 1 and "already published" in again.output


def test_fetch_refuses_a_version_that_is_not_a_number(tmp_path: Path) -> None:
    args = ["fetch", "newest", "--relay", "http://127.0.0.1:9", "--coordinator-id", "x", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_BAD_CONFIG and "latest" in result.output


def test_serve_without_upstream_or_coordinator_says_what_is_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--data-dir", str(tmp_path), "--port", "0"])
    assert result.exit_code == EXIT_BAD_CONFIG and "upstream" in result.output
    result = CliRunner().invoke(app, ["serve", "--upstream", "http://127.0.0.1:9", "--data-dir", str(tmp_path)])
    assert result.exit_code == EXIT_BAD_CONFIG and "coordinator" in result.output


def test_serve_refuses_an_empty_or_placeholder_coordinator_id(tmp_path: Path) -> None:
    # an empty id (docker-compose's unset ${COORDINATOR_ID:-}) or the docs' placeholder used to start a relay
    # that refused every manifest forever while /healthz said OK
    for bad in ["", "12D3KooW..."]:
        args = ["serve", "--upstream", "http://127.0.0.1:9/shardcast", "--coordinator-id", bad]
        result = CliRunner().invoke(app, [*args, "--set", f'data_dir="{tmp_path}"'])
        assert result.exit_code == EXIT_BAD_CONFIG, result.output
        assert "is not a coordinator node id" in result.output and "keys show" in result.output


def test_the_progress_of_a_full_start_and_a_chain_counts_every_byte() -> None:
    from shardcast.client.fetch import ProgressBar

    bar = ProgressBar()
    events: list[dict[str, object]] = [
        {
            "event": "plan",
            "version": 7,
            "base": 5,
            "from": "full",
            "chain": [6, 7],
            "bytes": 1200,
            "checkpoint_bytes": 1000,
        },
        {"event": "manifest", "version": 5, "total_bytes": 1000, "bytes_resumed": 400},
        {"event": "shard_done", "bytes": 600},
        {"event": "manifest", "version": 6, "total_bytes": 100, "bytes_resumed": 0},
        {"event": "shard_done", "bytes": 100},
        {"event": "manifest", "version": 7, "total_bytes": 100, "bytes_resumed": 0},
        {"event": "shard_done", "bytes": 100},
    ]
    try:
        for event in events:
            bar.on_event(event)
        (task,) = bar.progress.tasks
        assert (task.total, task.completed, task.fields["version"]) == (1200, 1200, 7)
    finally:
        bar.stop()
