"""Step 2: train a byte-level BPE tokenizer on the corpus and wrap it for transformers.

A byte-level BPE (``tokenizers``) with a 4,096-token vocabulary, trained on the
chat-formatted corpus, saved as ``tokenizer.json`` and wrapped in a
``PreTrainedTokenizerFast`` with a minimal ChatML-style chat template so that
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` works
(this is what ``expertcache collect`` calls).

Special tokens: ``<|endoftext|>`` (also the padding token), ``<|im_start|>``,
``<|im_end|>`` (end of a turn; the model's EOS).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD, IM_START, IM_END = SPECIAL_TOKENS

#: Jinja chat template (ChatML layout). No system prompt is added; there is no reasoning mode to disable.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def render(user: str, assistant: str) -> str:
    """One training exchange as text, exactly as the chat template lays it out (plus the answer)."""
    return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{assistant}{IM_END}\n"


def iter_texts(corpus: Path) -> Iterator[str]:
    """The rendered exchanges of ``corpus.jsonl``, in file order."""
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            ex = json.loads(line)
            yield render(ex["user"], ex["assistant"])


def train_tokenizer(corpus: Path, out_dir: Path, vocab_size: int = 4096):
    """Train the BPE on ``corpus`` and save a transformers tokenizer into ``out_dir``; return it."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic merges and a polite CPU footprint
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(iter_texts(corpus), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD,
                                      unk_token=None, bos_token=None)
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.model_max_length = 4096
    wrapped.save_pretrained(out_dir)
    return wrapped


if __name__ == "__main__":
    import sys

    t = train_tokenizer(Path(sys.argv[1]), Path(sys.argv[2]))
    print(len(t), t.apply_chat_template([{"role": "user", "content": "Explain json.dumps."}],
                                        add_generation_prompt=True, tokenize=False))
