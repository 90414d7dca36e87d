"""The built-in model ``builtin:tiny-qwen2``: built on first use by our code, offline, deterministically.

It is a Qwen2-architecture causal LM of about half a million parameters with untied input
and output embeddings (every figure recorded so far was measured on it), randomly initialised
from a fixed seed, and a small byte-level BPE tokenizer trained on the built-in tasks' text
(:mod:`trainer.tokenizer`). The pair is written once as an ordinary HF checkpoint directory
(safetensors, config, tokenizer) under the built-in cache dir (``$PRIME_BUILTIN_DIR``, default
``~/.prime-network/builtin``); later uses load that directory. Nothing is downloaded.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.random_model import random_causal_lm
from environments.builtin import builtin_environment
from protocol.errors import ConfigError
from trainer.tokenizer import CHAT_END_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, save_hf_tokenizer, train_tokenizer
from trainer.transformers_logs import quiet_transformers

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import Qwen2Config, Qwen3Config

log = logging.getLogger("trainer.builtin")

BUILTIN_PREFIX = "builtin:"
TINY_QWEN2 = "tiny-qwen2"
REVERSE_START = "tiny-qwen2-reverse-start"
"""The RL start point: an early SFT checkpoint of tiny-qwen2 on reverse_text (trainer.start)."""
TOKENIZER_VOCAB_SIZE = 320
TOKENIZER_CORPUS_EXAMPLES = 4000
INIT_SEED = 0

SMALL_QWEN3 = "small-qwen3"
"""A Qwen3 of a few million parameters with a subword tokenizer and a chat template (random weights)."""
ARITHMETIC_START = "small-qwen3-arithmetic-start"
"""An RL start point for exact answers: small-qwen3 after a short SFT on arithmetic (trainer.start)."""
SORT_START = "small-qwen3-sort-start"
"""The demo's RL start point: small-qwen3 stopped early in its SFT on sort_digits (trainer.start)."""
CALCULATOR_START = "small-qwen3-calculator-start"
"""A multi-turn RL start point: small-qwen3 stopped early in its SFT on calculator episodes (trainer.start)."""
SMALL_QWEN3_SHAPE: dict[str, int] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
SMALL_TOKENIZER_VOCAB_SIZE = 512
TINY_QWEN2_VL = "tiny-qwen2-vl"
"""A Qwen2-VL of under a million parameters: small-qwen3's tokenizer with the vision tokens, random weights."""
COUNT_START = "tiny-qwen2-vl-count-start"
"""A vision-language RL start point: tiny-qwen2-vl stopped early in its SFT on count_shapes (trainer.start)."""
TINY_QWEN2_VL_VISION_SHAPE: dict[str, int] = {
    "depth": 2,
    "embed_dim": 64,
    "num_heads": 4,
    "mlp_ratio": 2,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_PIXELS = (28 * 28, 224 * 224)
"""The pixel counts the built-in vision model's image processor keeps images within (smaller or larger are
resized): a 56 x 56 image is 4 image tokens, a 224 x 224 one 64."""
TOKENIZER_TASKS = ("arithmetic", "reverse_text")
"""The built-in tasks whose text trains the built-in tokenizers: fixed, so a task added later changes no built
model (their letters, digits and signs cover the later tasks' text)."""

# Shapes of the Qwen2 configs our code builds. "tiny" is the built-in model; "50m" is the
# larger config the trainer benchmark measures (about 50M parameters with the built-in vocab).
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "50m": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 16,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}

TINY_QWEN2_VL_TEXT_SHAPE = MODEL_SHAPES["tiny"]
"""The text model of :data:`TINY_QWEN2_VL`: tiny-qwen2's shape."""


def builtin_cache_dir() -> Path:
    return Path(os.environ.get("PRIME_BUILTIN_DIR", Path.home() / ".prime-network" / "builtin"))


def is_builtin(name: str) -> bool:
    return name.startswith(BUILTIN_PREFIX)


def qwen2_config(
    shape: str | Mapping[str, int], vocab_size: int, eos_token_id: int, max_position_embeddings: int = 256
) -> Qwen2Config:
    """A Qwen2 config of one of :data:`MODEL_SHAPES` (or of dimensions given in their keys), untied, fp32."""
    from transformers import Qwen2Config

    dims: dict[str, Any] = dict(MODEL_SHAPES[shape] if isinstance(shape, str) else shape)
    config: Qwen2Config = untied_fp32_config(
        Qwen2Config, dims, vocab_size, eos_token_id, eos_token_id, max_position_embeddings
    )
    return config


def untied_fp32_config(
    config_class: Any,
    dims: Mapping[str, int],
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int,
    max_position_embeddings: int,
) -> Any:
    """A built-in model's config: untied embeddings (vLLM's in-place reload on a CPU needs them), fp32, no sliding
    window, BOS the pad token."""
    return config_class(
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_sliding_window=False,
        bos_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype="float32",
        **dims,
    )


def builtin_tokenizer() -> Tokenizer:
    """The built-in tokenizer, trained on the built-in tasks' text (deterministic)."""

    corpus = [text for name in TOKENIZER_TASKS for text in builtin_environment(name).corpus(TOKENIZER_CORPUS_EXAMPLES)]
    return train_tokenizer(corpus, TOKENIZER_VOCAB_SIZE)


def build_random_qwen2(output_dir: Path, shape: str = "tiny", tokenizer: Tokenizer | None = None) -> None:
    """Save a Qwen2 of ``shape`` initialised from :data:`INIT_SEED`, with ``tokenizer`` (default: built-in)."""
    from transformers import GenerationConfig

    quiet_transformers()
    tokenizer = tokenizer or builtin_tokenizer()
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    if eos_id is None:
        raise ValueError(f"the tokenizer has no {EOS_TOKEN} token")
    config = qwen2_config(shape, tokenizer.get_vocab_size(), eos_id)
    model = random_causal_lm(config, INIT_SEED)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=eos_id)
    model.save_pretrained(str(output_dir), safe_serialization=True)
    save_hf_tokenizer(tokenizer, output_dir, config.max_position_embeddings)


def qwen3_config(
    vocab_size: int, eos_token_id: int, pad_token_id: int, max_position_embeddings: int = 256
) -> Qwen3Config:
    """The Qwen3 config of :data:`SMALL_QWEN3_SHAPE`: untied (vLLM's in-place reload needs it), fp32."""
    from transformers import Qwen3Config

    config: Qwen3Config = untied_fp32_config(
        Qwen3Config, SMALL_QWEN3_SHAPE, vocab_size, eos_token_id, pad_token_id, max_position_embeddings
    )
    return config


def chat_tokenizer() -> Tokenizer:
    """A subword tokenizer trained on the built-in tasks' text as a chat model sees it (deterministic)."""

    corpus: list[str] = []
    for name in TOKENIZER_TASKS:
        environment = builtin_environment(name)
        for i in range(TOKENIZER_CORPUS_EXAMPLES):
            example = environment.example(i)
            corpus.append(f"<|im_start|>user\n{example.prompt}<|im_end|>\n<|im_start|>assistant\n{example.answer}")
    return train_tokenizer(corpus, SMALL_TOKENIZER_VOCAB_SIZE)


def build_small_qwen3(output_dir: Path) -> None:
    """Save the :data:`SMALL_QWEN3` checkpoint: random weights from :data:`INIT_SEED`, ChatML template, EOS
    ``<|im_end|>``."""
    from transformers import GenerationConfig

    quiet_transformers()
    tokenizer = chat_tokenizer()
    eos_id, pad_id = tokenizer.token_to_id(CHAT_END_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    if eos_id is None or pad_id is None:
        raise ValueError(f"the tokenizer lacks {CHAT_END_TOKEN} or {EOS_TOKEN}")
    config = qwen3_config(tokenizer.get_vocab_size(), eos_id, pad_id)
    model = random_causal_lm(config, INIT_SEED)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id)
    model.save_pretrained(str(output_dir), safe_serialization=True)
    save_hf_tokenizer(tokenizer, output_dir, config.max_position_embeddings, CHAT_TEMPLATE)


def build_tiny_qwen2_vl(output_dir: Path) -> None:
    """Save the :data:`TINY_QWEN2_VL` checkpoint: random weights from :data:`INIT_SEED`, ChatML template, EOS
    ``<|im_end|>``, and its image processor (transformers' PIL one)."""
    from tokenizers import AddedToken
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLImageProcessorPil

    quiet_transformers()
    tokenizer = chat_tokenizer()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in VISION_TOKENS])
    names = (*VISION_TOKENS, CHAT_END_TOKEN, EOS_TOKEN)
    found = [tokenizer.token_to_id(token) for token in names]
    ids = [token_id for token_id in found if token_id is not None]
    if len(ids) != len(names):
        raise ValueError(f"the tokenizer lacks one of {names}")
    start_id, end_id, image_id, video_id, eos_id, pad_id = ids
    text = untied_fp32_config(dict, TINY_QWEN2_VL_TEXT_SHAPE, tokenizer.get_vocab_size(), eos_id, pad_id, 512)
    head_half = TINY_QWEN2_VL_TEXT_SHAPE["hidden_size"] // TINY_QWEN2_VL_TEXT_SHAPE["num_attention_heads"] // 2
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope(head_half)}
    vision = {**TINY_QWEN2_VL_VISION_SHAPE, "hidden_size": TINY_QWEN2_VL_TEXT_SHAPE["hidden_size"]}
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=image_id,
        video_token_id=video_id,
        vision_start_token_id=start_id,
        vision_end_token_id=end_id,
        tie_word_embeddings=False,
    )
    model = random_causal_lm(config, INIT_SEED, image_text=True)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id)
    model.save_pretrained(str(output_dir), safe_serialization=True)
    save_hf_tokenizer(tokenizer, output_dir, 512, CHAT_TEMPLATE)
    min_pixels, max_pixels = IMAGE_PIXELS
    Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(str(output_dir))


def _mrope(head_half: int) -> list[int]:
    """Qwen2-VL's split of a head's rotary frequencies over (time, height, width), in Qwen2-VL's proportions."""
    time_part = head_half // 4
    height_part = (head_half - time_part) // 2
    return [time_part, height_part, head_half - time_part - height_part]


Builder = Callable[[Path], None]
"""Writes a built-in model's checkpoint directory into the given (empty) directory."""

KNOWN_BUILTINS = (
    TINY_QWEN2,
    REVERSE_START,
    SMALL_QWEN3,
    ARITHMETIC_START,
    SORT_START,
    CALCULATOR_START,
    TINY_QWEN2_VL,
    COUNT_START,
)
UNTRAINED_BUILDERS: Mapping[str, Builder] = {
    TINY_QWEN2: build_random_qwen2,
    SMALL_QWEN3: build_small_qwen3,
    TINY_QWEN2_VL: build_tiny_qwen2_vl,
}
"""What this module builds itself; the trained start is built by :mod:`trainer.resolve` (it needs SFT)."""


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}(@[A-Za-z0-9._/-]{1,255})?$")
"""A Hugging Face hub model id, ``ORG/NAME``, with an optional ``@REVISION`` (branch, tag or commit)."""


def is_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name)) and ".." not in name


def hub_snapshot(name: str) -> Path:
    """The local snapshot directory of hub model ``ORG/NAME[@REVISION]``, downloaded into the Hugging Face cache.

    The cache (``HF_HUB_CACHE`` / ``HF_HOME``), ``HF_HUB_OFFLINE`` and the token are huggingface_hub's own
    settings: offline, only what the cache holds is used. A cached snapshot's files are symlinks into the cache's
    blobs; whatever reads them (publishing as v0, the trainer) follows the links.
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    except ModuleNotFoundError as exc:  # pragma: no cover - transformers depends on huggingface_hub
        raise ConfigError(f"model {name!r} is a hub id, but huggingface_hub is not installed") from exc
    repo_id, _, revision = name.partition("@")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        log.info("resolving %s on the Hugging Face hub%s", name, " (offline: the local cache only)" if offline else "")
        path = Path(snapshot_download(repo_id, revision=revision or None, local_files_only=offline))
    except LocalEntryNotFoundError as exc:
        raise ConfigError(
            f"model {name!r} is not in the Hugging Face cache and the hub cannot be asked "
            f"({'HF_HUB_OFFLINE is set' if offline else 'no connection'}); download it once where there is a "
            f"network (`huggingface-cli download {repo_id}`) into the cache, or give a local checkpoint directory"
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ConfigError(f"model {name!r}: the hub has no such model or revision ({type(exc).__name__})") from exc
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {name!r} resolved to {path}, which is not an HF checkpoint (no config.json)")
    return path


def resolve_model_path(name: str, cache_dir: Path | None = None, builders: Mapping[str, Builder] | None = None) -> Path:
    """The local checkpoint directory of ``name``: a path as given, or a built-in (built on first use by ``builders``,
    default :data:`UNTRAINED_BUILDERS`; :func:`trainer.resolve.resolve_model_path` builds every built-in)."""
    builders = UNTRAINED_BUILDERS if builders is None else builders
    if not is_builtin(name):
        path = Path(name)
        if (path / "config.json").is_file():
            return path
        if not path.exists() and is_hub_id(name):
            return hub_snapshot(name)
        what = "does not exist" if not path.exists() else "is not an HF checkpoint directory (no config.json)"
        builtins = ", ".join(BUILTIN_PREFIX + b for b in KNOWN_BUILTINS)
        raise ConfigError(
            f"model {str(path)!r} {what}; give the path of a local HF checkpoint directory, a Hugging Face hub id "
            f"(ORG/NAME, or ORG/NAME@REVISION) or a built-in model ({builtins})"
        )
    builtin = name.removeprefix(BUILTIN_PREFIX)
    if builtin not in KNOWN_BUILTINS:
        known = ", ".join(BUILTIN_PREFIX + b for b in KNOWN_BUILTINS)
        raise ConfigError(f"unknown built-in model {name!r}; known: {known}")
    root = cache_dir or builtin_cache_dir()
    target = root / builtin
    if (target / "config.json").is_file():
        return target
    if builtin not in builders:
        raise ConfigError(
            f"built-in model {name!r} is not built yet; build it once with `prime-trainer start-checkpoint`"
        )
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f".{builtin}.lock", name):
        if (target / "config.json").is_file():  # another process built it while this one waited
            return target
        log.info("building built-in model %s in %s (first use, once)", name, target)
        staging = Path(tempfile.mkdtemp(prefix=f".{builtin}-", dir=root))
        staging.chmod(0o755)
        try:
            builders[builtin](staging)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("built-in model %s ready", name)
    return target


@contextmanager
def _build_lock(path: Path, name: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for one build: a second process that wants the same built-in (two roles
    started at once on one machine) waits for the first one's build instead of doing it again. The kernel releases
    it when the holder ends, however it ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("built-in model %s is being built by another process; waiting for it", name)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
