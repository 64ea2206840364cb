"""Prompt sets for ``expertcache collect``: JSON Lines rows, checked with line-precise errors.

One JSON object per line::

    {"id"?: str, "prompt": str}                      raw text
    {"id"?: str, "messages": [{"role", "content"}]}  a chat conversation
    optional "category": str                          workload label (trace/labels.py)

Exactly one of ``prompt`` / ``messages``. Without ``id`` the request id is the
0-based index of the row among the prompts (``"0"``, ``"1"``, ...). Ids must be unique.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import ValidationError
from ..jsonl import iter_records
from ..storage import sha256_file

__all__ = ["PromptRecord", "read_prompts", "prompt_set_sha256"]

_KEYS = {"id", "prompt", "messages", "category"}


@dataclass(frozen=True)
class PromptRecord:
    """One request of a prompt set.

    Attributes
    ----------
    request_id
        Unique id (the row's ``id`` or its 0-based index).
    prompt
        Raw text, or ``None`` when ``messages`` is given.
    messages
        Chat messages ``({"role", "content"}, ...)``, or ``None``.
    category
        Workload category, or ``None``.
    line
        1-based line of the row in the file (for error messages).
    """

    request_id: str
    prompt: str | None
    messages: tuple[dict[str, Any], ...] | None
    category: str | None
    line: int


def read_prompts(path: str | os.PathLike[str]) -> list[PromptRecord]:
    """Read and check a prompts JSONL file.

    Raises
    ------
    ValidationError
        Naming the file, line and field of the first bad row.
    """
    src = str(path)
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    for line_no, rec in iter_records(path):
        unknown = sorted(set(rec) - _KEYS)
        if unknown:
            raise ValidationError(f"unknown field {unknown[0]!r}; expected id, prompt or messages, category",
                                  source=src, record=line_no, field=unknown[0])
        has_p, has_m = "prompt" in rec, "messages" in rec
        if has_p == has_m:
            raise ValidationError("expected exactly one of 'prompt' (a string) or 'messages' (a list of "
                                  "{role, content} objects)", source=src, record=line_no)
        prompt = messages = None
        if has_p:
            prompt = rec["prompt"]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValidationError(f"expected a non-empty string; got {prompt!r:.60}", source=src,
                                      record=line_no, field="prompt")
        else:
            messages = _messages(rec["messages"], src, line_no)
        rid = rec.get("id", str(len(records)))
        if not isinstance(rid, str) or not rid.strip():
            raise ValidationError(f"expected a non-empty string; got {rid!r}", source=src, record=line_no,
                                  field="id")
        if rid in seen:
            raise ValidationError(f"duplicate id {rid!r} (first on line {seen[rid]})", source=src,
                                  record=line_no, field="id")
        seen[rid] = line_no
        cat = rec.get("category")
        if cat is not None and (not isinstance(cat, str) or not cat.strip()):
            raise ValidationError(f"expected a non-empty string; got {cat!r}", source=src, record=line_no,
                                  field="category")
        records.append(PromptRecord(rid, prompt, messages, cat, line_no))
    if not records:
        raise ValidationError("no prompts in the file; expected one JSON object per line with 'prompt' or "
                              "'messages'", source=src)
    return records


def _messages(value: Any, src: str, line_no: int) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise ValidationError(f"expected a non-empty list of {{role, content}} objects; got {value!r:.60}",
                              source=src, record=line_no, field="messages")
    for i, msg in enumerate(value):
        if (not isinstance(msg, dict) or not isinstance(msg.get("role"), str)
                or not isinstance(msg.get("content"), str)):
            raise ValidationError(f"message {i} must be an object with string 'role' and 'content'; "
                                  f"got {msg!r:.60}", source=src, record=line_no, field="messages")
    return tuple(dict(m) for m in value)


def prompt_set_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of the prompts file's bytes (the prompt-set hash of the manifest)."""
    return sha256_file(os.fspath(path))  # type: ignore[arg-type]
