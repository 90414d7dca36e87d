"""A Hugging Face hub cache filled offline, laid out as huggingface_hub lays out a real one.

``<cache>/models--ORG--NAME/`` holds ``blobs/<sha256>`` (the files' bytes), ``snapshots/<revision>/<file>``
(symlinks into blobs, as in a real cache: code that copies or hashes a snapshot must follow them) and
``refs/main`` (the revision). With ``HF_HUB_OFFLINE=1`` huggingface_hub resolves the model from it alone.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def fill_hub_cache(cache: Path, repo_id: str, checkpoint: Path, revision: str = "a" * 40) -> Path:
    """Put the files of ``checkpoint`` into ``cache`` as model ``repo_id`` at ``revision``; the snapshot dir."""
    org, name = repo_id.split("/")
    root = cache / f"models--{org}--{name}"
    snapshot = root / "snapshots" / revision
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in sorted(checkpoint.iterdir()):
        if not path.is_file():
            continue
        data = path.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / path.name)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(revision)
    return snapshot
