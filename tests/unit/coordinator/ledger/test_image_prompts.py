"""Image prompts in the ledger: a task names each prompt's images by their hashes, never carries their pixels, and
the wire refuses a malformed hash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from coordinator.ledger.ledger import Ledger
from coordinator.ledger.storage.engine import Database
from environments.builtin import builtin_environment
from environments.images import Image
from environments.prompts import EnvironmentPrompts
from protocol.identity import NodeIdentity
from protocol.schemas import LeaseRequest, Prompt
from tests.support.ledger_helpers import ledger_config, register_request


class ByteTokenizer:
    """A text tokenizer without a chat template: one id per byte."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


class ShortBlocks:
    """A vision-language policy's image blocks, shortened: one marker per image, naming it."""

    def image_block(self, image: Image) -> str:
        return f"<image {image.sha256[:8]}>"


@pytest.fixture
def database(ledger_url: str) -> Iterator[Database]:
    db = Database(ledger_url)
    yield db
    db.dispose()


def test_a_leased_task_pins_each_prompts_images_by_hash(database: Database, tmp_path: Path) -> None:
    environment = builtin_environment("count_shapes")
    prompts = EnvironmentPrompts(environment, ByteTokenizer(), ShortBlocks())
    config = ledger_config(tmp_path, database.url, scheduling__prompts_per_task=2)
    ledger = Ledger(database, config, prompts, NodeIdentity.generate().node_id)
    worker = NodeIdentity.generate().node_id
    ledger.register(worker, "127.0.0.1", register_request("worker"))
    (task,) = ledger.lease(worker, LeaseRequest(max_tasks=1)).tasks
    for prompt in task.prompts:
        assert prompt.example_index is not None
        example = environment.example(prompt.example_index)
        assert prompt.image_sha256 == [example.images[0].sha256]
        assert bytes(prompt.token_ids).decode().startswith(f"<image {example.images[0].sha256[:8]}>")
        assert len(prompt.text) < 1000  # the text holds the image's place, never its pixels
    assert task.prompts[0].image_sha256 != task.prompts[1].image_sha256


def test_a_text_prompt_carries_no_image_hashes(database: Database, tmp_path: Path) -> None:
    prompts = EnvironmentPrompts(builtin_environment("arithmetic"), ByteTokenizer())
    ledger = Ledger(database, ledger_config(tmp_path, database.url), prompts, NodeIdentity.generate().node_id)
    worker = NodeIdentity.generate().node_id
    ledger.register(worker, "127.0.0.1", register_request("worker"))
    (task,) = ledger.lease(worker, LeaseRequest(max_tasks=1)).tasks
    assert all(prompt.image_sha256 == [] for prompt in task.prompts)


@pytest.mark.parametrize("digest", ["ab", "G" * 64, "A" * 64])
def test_the_wire_refuses_a_malformed_image_hash(digest: str) -> None:
    with pytest.raises(ValidationError):
        Prompt(prompt_index=0, token_ids=[1], image_sha256=[digest])
    with pytest.raises(ValidationError):
        Prompt(prompt_index=0, token_ids=[1], image_sha256=["a" * 64] * 17)  # more images than a prompt may have
