"""Collection parameters (§3.3): one frozen record, hashed into the collection identity."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ValidationError

__all__ = ["CollectConfig", "DTYPES"]

#: Accepted ``dtype`` names ("auto" keeps the checkpoint's dtype).
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class CollectConfig:
    """How ``expertcache collect`` runs a model over a prompt set (defaults follow §3.3).

    Attributes
    ----------
    max_new_tokens
        Most decode forwards recorded per request (384); fewer on natural EOS.
        A decode forward processes one generated token; an EOS token ends the
        request and is not forwarded (exactly as when the request runs alone).
    max_prompt_tokens
        Prompt cap in tokens (4096); longer prompts keep their last tokens (the
        chat template's generation prompt) and the manifest records how many were dropped.
    chat_template
        Apply the tokenizer's chat template when it has one (reasoning disabled
        with ``enable_thinking=False`` where the template reads that flag).
        ``False`` tokenizes ``prompt`` text raw (rows with ``messages`` then fail).
    batch_size
        Prompts generated together (left-padded; padded rows are never recorded).
    shard_size
        Prompts per shard; a shard is the unit of crash-safe resume.
    save_logits, save_hidden
        Also store the full router logits / the hidden state entering each MoE
        block, fp16, as sharded ``.npy`` files.
    dtype
        Model dtype: one of :data:`DTYPES`.
    device
        Torch device to place the model on ("cpu", "cuda", "cuda:1"); ``None``:
        CPU unless ``device_map`` is given.
    device_map
        ``device_map`` for ``from_pretrained`` (e.g. "auto"); exclusive with ``device``.
    revision
        Model revision (branch, tag or commit) to load.
    """

    max_new_tokens: int = 384
    max_prompt_tokens: int = 4096
    chat_template: bool = True
    batch_size: int = 8
    shard_size: int = 32
    save_logits: bool = False
    save_hidden: bool = False
    dtype: str = "auto"
    device: str | None = None
    device_map: str | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        for name, lo in (("max_new_tokens", 0), ("max_prompt_tokens", 1), ("batch_size", 1), ("shard_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValidationError(f"must be an integer >= {lo}; got {value!r}", field=name)
        if self.dtype not in DTYPES:
            raise ValidationError(f"must be one of {', '.join(DTYPES)}; got {self.dtype!r}", field="dtype")
        if self.device is not None and self.device_map is not None:
            raise ValidationError("give --device or --device-map, not both", field="device")

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a JSON-ready dict."""
        return asdict(self)
