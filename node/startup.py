"""What every long-running node (worker, validator) settles at start: its version, the coordinator it trusts,
and the end tokens of the policy it serves or checks (every one the checkpoint's configs, tokenizer and chat
template name: workers stop on the same set validators check termination against), and in a LoRA run that the
base it downloaded is the one the run spec pins."""

from __future__ import annotations

import asyncio
import json
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from node.retry import with_retries
from protocol.errors import IdentityError, StartupError
from protocol.identity import public_key_from_node_id
from protocol.ledger_client import LedgerClient
from protocol.schemas import LoraPin
from runtime.logs import adopt_transformers_logging
from shardcast.format.manifest import checkpoint_digest

log = logging.getLogger("node.startup")
PINNED_COORDINATOR_FILE = "coordinator_id"


def software_version() -> str:
    try:
        return version("prime-network")
    except PackageNotFoundError:
        return "dev"


def pin_coordinator_id(data_dir: Path, learned: str) -> str:
    """Trust on first use: remember the coordinator id, and refuse a different one later."""
    public_key_from_node_id(learned)  # raises IdentityError for junk
    path = data_dir / PINNED_COORDINATOR_FILE
    if path.exists():
        pinned = path.read_text().strip()
        if pinned != learned:
            raise IdentityError(
                f"the coordinator now signs as {learned}, but {path} pins {pinned}; if the operator really "
                "changed keys, delete that file (or pass --set coordinator_id=...)"
            )
        return pinned
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(learned + "\n")
    return learned


async def trusted_coordinator_id(
    ledger: LedgerClient, data_dir: Path, configured: str | None, stop: asyncio.Event
) -> str:
    """The coordinator id to trust: the configured one, else the signer of its latest manifest; pinned."""
    if configured is None:
        configured = (await with_retries("coordinator identity", ledger.manifest, stop)).signer
    return pin_coordinator_id(data_dir, configured)


END_OF_TURN_PROBE = "end-of-turn-probe-7f3a"
"""The assistant message the chat template renders to find the token it closes a turn with."""


def _config_eos(path: Path) -> list[int]:
    if not path.is_file():
        return []
    value = json.loads(path.read_text()).get("eos_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [int(item) for item in value if isinstance(item, int) and not isinstance(item, bool)]
    return []


def _end_of_turn(tokenizer: Any) -> list[int]:
    """The special token the chat template puts right after an assistant message (none without a template)."""
    messages = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": END_OF_TURN_PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # no template, or one that cannot render a plain turn: it names none
        log.debug("chat template names no end-of-turn token: %s", exc)
        return []
    _head, found, after = str(text).partition(END_OF_TURN_PROBE)
    special = {int(token_id) for token_id, token in tokenizer.added_tokens_decoder.items() if token.special}
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if found else []
    return [int(ids[0])] if ids and int(ids[0]) in special else []


def _tokenizer_end_tokens(checkpoint_dir: Path) -> list[int]:
    """The tokenizer's EOS token and the chat template's end-of-turn token, when the checkpoint has a tokenizer."""
    if not any((checkpoint_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return []
    from transformers import AutoTokenizer

    adopt_transformers_logging()  # a node's first use of transformers: its lines in the node's log format
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint_dir))
    found = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    return found + _end_of_turn(tokenizer)


def eos_token_ids(checkpoint_dir: Path) -> tuple[int, ...]:
    """Every token that ends a completion of the checkpoint, as its own files name them: the EOS ids of its
    generation and model configs, its tokenizer's EOS token and the token its chat template closes an assistant
    turn with. Workers stop on each and validators' termination check knows each, so an end token can neither
    sit unseen in the middle of a completion nor end an honest one that a validator would then refuse."""
    found = _config_eos(checkpoint_dir / "generation_config.json") + _config_eos(checkpoint_dir / "config.json")
    return tuple(dict.fromkeys(found + _tokenizer_end_tokens(checkpoint_dir)))


def check_lora_base(checkpoint_dir: Path, lora: LoraPin) -> None:
    """A StartupError (one line) unless ``checkpoint_dir``, a LoRA run's version 0, is the base its spec pins."""
    found = checkpoint_digest(checkpoint_dir)
    if found != lora.base_hash:
        raise StartupError(
            f"the run's base model (policy v0 in {checkpoint_dir}) hashes to {found[:12]}, "
            f"not the {lora.base_hash[:12]} its run spec pins",
            "remove that folder so it is downloaded again, and tell the run's operator if it comes back the same",
        )
    log.info("LoRA run: base model v0 matches the pinned hash %s", lora.base_hash[:12])
