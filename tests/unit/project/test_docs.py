"""The README and docs/ stay true: links resolve, shown commands parse, the README stays short.

Every relative link in README.md and docs/*.md must name an existing file and, with ``#anchor``,
a heading of that file (GitHub's anchor rules). Every ``prime-*`` command line in a fenced shell
block must parse with our own CLIs (subcommand exists, flags accepted, required options given);
one shown inline in backticks must name a real subcommand with accepted flags. The README is the
front door and stays within 10 KB. No text outside tests/ points outside the repository.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.support.cli_parse import REPO_ROOT, console_scripts, parse_command

README = REPO_ROOT / "README.md"
DOC_FILES = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
README_MAX_BYTES = 10 * 1024

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
# What must never appear outside tests/: paths out of the repository and tracker references.
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|\bissues? #?\d+\b", re.IGNORECASE)


def prose_and_blocks(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines outside fenced blocks, and each fenced block as (language, lines)."""
    prose: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    block: list[str] | None = None
    language = ""
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if block is None:
                block, language = [], line.strip()[3:].strip().lower()
            else:
                blocks.append((language, block))
                block = None
            continue
        if block is None:
            prose.append(line)
        else:
            block.append(line)
    assert block is None, "a fenced code block is never closed"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ... as on GitHub)."""
    prose, _ = prose_and_blocks(path.read_text())
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose:
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    prose, _ = prose_and_blocks(path.read_text())
    text = "\n".join(INLINE_CODE.sub("", line) for line in prose)
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def shell_commands(text: str) -> list[str]:
    """``prime-*`` command lines of the fenced shell blocks, continuations joined, comments cut."""
    _, blocks = prose_and_blocks(text)
    commands: list[str] = []
    for language, lines in blocks:
        if language not in SHELL_LANGUAGES:
            continue
        joined: list[str] = []
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line.strip())
        for line in joined:
            for part in re.split(r"\s*(?:&&|;|\|)\s*", line.lstrip("$ ")):
                words = shlex.split(part, comments=True)
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
                    words = words[1:]
                redirect = next((i for i, word in enumerate(words) if re.match(r"\d?>", word)), len(words))
                words = words[:redirect]  # `> file`, `2>&1`: the shell's, not the command's
                if words and words[0] in console_scripts():
                    commands.append(shlex.join(words))
    return commands


def inline_commands(text: str) -> list[str]:
    """``prime-*`` command lines shown inline (in backticks) in the prose, without placeholders."""
    prose, _ = prose_and_blocks(text)
    found = []
    for line in prose:
        for span in INLINE_CODE.findall(line):
            words = span.split()
            if words and words[0] in console_scripts() and len(words) > 1 and "..." not in span:
                found.append(span)
    return found


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@pytest.mark.parametrize("path", DOC_FILES, ids=doc_id)
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{target}: no file {destination}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {doc_id(destination)}")
    assert not broken, f"{doc_id(path)} has broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("path", DOC_FILES, ids=doc_id)
def test_every_shown_command_parses_with_our_cli(path: Path) -> None:
    text = path.read_text()
    failures = []
    for command in shell_commands(text):
        try:
            parse_command(shlex.split(command))
        except Exception as exc:  # a click usage error or our assertion: report them all at once
            failures.append(f"{command}\n    {type(exc).__name__}: {exc}")
    for command in inline_commands(text):
        try:
            parse_command(shlex.split(command), resilient=True)
        except Exception as exc:
            failures.append(f"`{command}`\n    {type(exc).__name__}: {exc}")
    assert not failures, f"{doc_id(path)} shows commands our CLIs refuse:\n" + "\n".join(failures)


def test_the_docs_show_commands_at_all() -> None:
    """The command check above is not vacuous: the README and the user pages show real commands."""
    for name in ("README.md", "docs/contributor.md", "docs/operator.md", "docs/validator.md"):
        assert shell_commands((REPO_ROOT / name).read_text()), f"{name} shows no prime-* command"


def test_the_command_check_leaves_redirections_to_the_shell() -> None:
    sample = "```bash\nprime-worker config show --set gpu=none > w.toml 2>&1\n```\n"
    assert shell_commands(sample) == ["prime-worker config show --set gpu=none"]


def test_the_command_check_catches_a_wrong_flag_and_subcommand() -> None:
    sample = "```bash\nprime-worker join --coordinator http://h:8000 --gpus all\nprime-worker jion\n```\n"
    commands = shell_commands(sample)
    assert commands == ["prime-worker join --coordinator http://h:8000 --gpus all", "prime-worker jion"]
    for command in commands:
        with pytest.raises(Exception, match=r"No such option: --gpus|no subcommand 'jion'"):
            parse_command(shlex.split(command))


def test_the_link_check_sees_links_and_anchors() -> None:
    assert "docs/contributor.md" in relative_links(README)
    assert "the-dashboard" in anchors(REPO_ROOT / "docs" / "operator.md")
    assert slug("Trainer: local RL") == "trainer-local-rl"
    assert slug("The RL loop (`[orchestrator]`)") == "the-rl-loop-orchestrator"


def test_readme_is_a_short_front_door() -> None:
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes; keep it within {README_MAX_BYTES}: move detail to docs/"
    )
    text = README.read_text()
    for command in ("make demo", "make test", "ENGINE_EXTRA=gpu", "prime-worker join", "prime-validator run"):
        assert command in text, f"README.md no longer shows {command}"


def setting_keys(model: type[BaseModel]) -> list[str]:
    """Every leaf setting of a config model, as dotted keys (``api.port``), through every table (union members
    included), and every table as ``[key]``."""
    from runtime.config import config_tables, field_tables

    keys = []
    for table in config_tables(model):
        if table.key:
            keys.append(f"[{table.key}]")
        for name, field in table.model.model_fields.items():
            key = f"{table.key}.{name}" if table.key else name
            if not any(inner.key == key for inner in field_tables(key, field)):
                keys.append(key)
    return list(dict.fromkeys(keys))


def test_the_configuration_reference_lists_every_setting() -> None:
    from runtime.config_reference import ROLES, role_config

    page = (REPO_ROOT / "docs" / "config-reference.md").read_text()
    assert "(config-reference.md)" in (REPO_ROOT / "docs" / "configuration.md").read_text()
    models: list[type[BaseModel]] = [role_config(role) for role in ROLES]
    missing = sorted({f"{m.__name__}: {key}" for m in models for key in setting_keys(m) if f"`{key}`" not in page})
    assert "api.port" in setting_keys(next(m for m in models if m.__name__ == "CoordinatorConfig"))
    assert not missing, "docs/config-reference.md does not describe:\n" + "\n".join(missing)


def repository_text_files() -> list[Path]:
    """Tracked and not-ignored files outside tests/ and docs/images/, as git sees the work tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = []
    for name in filter(None, listed.split("\0")):
        path = REPO_ROOT / name
        if name.startswith("tests/") or not path.is_file() or path.suffix in {".png", ".jpg", ".safetensors"}:
            continue
        files.append(path)
    return files


def test_no_text_outside_tests_points_outside_the_repository() -> None:
    offending = []
    for path in repository_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offending.append(f"{doc_id(path)}:{number}: {line.strip()}")
    assert not offending, "text that points outside the repository:\n" + "\n".join(offending)


def test_the_outside_pattern_matches_what_it_must() -> None:
    for bad in ("see ../shared/notes", "DESIGN.md, The loop", "added with the ledger, issue 3", "fixes issue #12"):
        assert OUTSIDE.search(bad), bad
    for fine in ("the lease may be re-issued", "issued_at", "a tissue 3 ways"):
        assert not OUTSIDE.search(fine), fine
