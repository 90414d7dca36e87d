"""The built-in tokenizer: a small byte-level BPE trained by our code with Qwen2's own pipeline.

Qwen2's pipeline is NFC normalisation, the Qwen2 split regex, then byte-level mapping, with a
byte-level decoder. transformers 5 ``AutoTokenizer`` rebuilds a Qwen2 tokenizer's
pre-tokenizer from its class on load, so a tokenizer trained with any other pipeline would
change ids on reload; trained with this one, the reloaded tokenizer gives the same ids.
Training is deterministic for a given corpus and vocabulary size.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS_TOKEN = "<|endoftext|>"
CHAT_END_TOKEN = "<|im_end|>"
"""Ends a chat turn: the EOS of a chat-templated model (as in Qwen's instruct checkpoints)."""
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", CHAT_END_TOKEN)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML, the format of Qwen's chat models: ``<|im_start|>``, the role, a newline, the content, ``<|im_end|>``."""


def train_tokenizer(corpus: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE over ``corpus`` with Qwen2's normaliser, pre-tokenizer and decoder."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)  # type: ignore[call-arg]
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def save_hf_tokenizer(
    tokenizer: Tokenizer, output_dir: Path, model_max_length: int, chat_template: str | None = None
) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` that ``AutoTokenizer`` reloads as Qwen2.

    With ``chat_template`` (ChatML: :data:`CHAT_TEMPLATE`) the tokenizer carries it and its EOS is
    :data:`CHAT_END_TOKEN`, as a chat model's; without, plain text and EOS :data:`EOS_TOKEN`."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=CHAT_END_TOKEN if chat_template else EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    if chat_template:
        wrapped.chat_template = chat_template
    wrapped.save_pretrained(str(output_dir))
    config_path = output_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
