"""bench/record.py: a bench's one JSON object kept with its date, commit, hardware and command."""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import bench.record
from bench.record import describe_hardware, parse_result, record


def git_repo(path: Path) -> str:
    """A repository with one commit; returns its short sha."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (path / "tracked.txt").write_text("one\n")
    git("add", "tracked.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "-m", "first")
    return git("rev-parse", "--short", "HEAD")


def bench_command(stdout: str, code: int = 0) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import sys; sys.stdout.write({stdout!r}); sys.stderr.write('progress'); sys.exit({code})",
    ]


def test_record_writes_the_result_with_its_provenance(tmp_path: Path) -> None:
    sha = git_repo(tmp_path)
    figures = {"summary": {"speedup": 1.5}, "rounds": [1, 2]}
    command = bench_command(json.dumps(figures) + "\n")
    path = record("demo_bench", command, hardware="2-core x86-64 CPU, 24 GiB, no GPU", root=tmp_path)
    assert path == tmp_path / "bench" / "results" / "demo_bench.json"
    document = json.loads(path.read_text())
    assert list(document) == ["date", "commit", "hardware", "command", "result"]
    assert document["result"] == figures
    assert document["commit"] == sha
    assert document["date"] == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert document["hardware"] == "2-core x86-64 CPU, 24 GiB, no GPU"
    assert document["command"] == shlex.join(command)


def test_uncommitted_changes_mark_the_commit_dirty(tmp_path: Path) -> None:
    sha = git_repo(tmp_path)
    (tmp_path / "tracked.txt").write_text("two\n")
    path = record("x", bench_command('{"summary": {}}'), hardware="h", root=tmp_path)
    assert json.loads(path.read_text())["commit"] == f"{sha}-dirty"


@pytest.mark.parametrize(
    ("stdout", "code", "error"),
    [
        ('{"summary": {}}', 3, "exited 3"),
        ("", 0, "printed nothing"),
        ('{"a": 1}\n{"b": 2}\n', 0, "not one JSON object"),
        ("[1, 2]", 0, "not an object"),
    ],
)
def test_a_bad_bench_run_records_nothing(tmp_path: Path, stdout: str, code: int, error: str) -> None:
    git_repo(tmp_path)
    with pytest.raises(ValueError, match=error):
        record("bad", bench_command(stdout, code), hardware="h", root=tmp_path)
    assert not (tmp_path / "bench" / "results" / "bad.json").exists()


def test_names_are_plain_file_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad result name"):
        record("../outside", bench_command("{}"), hardware="h", root=tmp_path)


def test_parse_result_and_hardware() -> None:
    assert parse_result('  {"summary": {"x": 1}}\n') == {"summary": {"x": 1}}
    hardware = describe_hardware()
    assert "-core " in hardware and " CPU" in hardware
    assert hardware.endswith("no GPU") or "x " in hardware


def test_every_kept_result_has_the_documented_shape() -> None:
    results = Path(__file__).resolve().parents[3] / "bench" / "results"
    for path in sorted(results.glob("*.json")):
        document = json.loads(path.read_text())
        assert list(document) == ["date", "commit", "hardware", "command", "result"], path.name
        datetime.date.fromisoformat(document["date"])
        assert isinstance(document["result"], dict) and "summary" in document["result"], path.name


@pytest.mark.parametrize("before_name", [True, False])
def test_hardware_may_stand_before_or_after_the_name(before_name: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, list[str], str | None]] = []

    def fake_record(name: str, command: list[str], hardware: str | None) -> Path:
        seen.append((name, command, hardware))
        return Path("/bench/results/unit.json")

    monkeypatch.setattr(bench.record, "record", fake_record)
    monkeypatch.setattr(bench.record, "ROOT", Path("/"))
    options = ["--hardware", "test box"]
    head = [*options, "unit"] if before_name else ["unit", *options]
    assert bench.record.main([*head, "--", "python", "-m", "bench.x", "--hardware", "inner"]) == 0
    assert seen == [("unit", ["python", "-m", "bench.x", "--hardware", "inner"], "test box")]
