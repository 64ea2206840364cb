"""Local JSON Lines data for router training and the accuracy hook (no downloads).

Training records are one JSON object per line with either ``"text"``, or
``"question"`` + ``"answer"`` (GSM8K format; trained as ``question\\nanswer``),
or ``"prompt"`` with an optional ``"completion"`` (e.g. a collection prompt set).
Task records for exact match are GSM8K format: ``"question"`` and an
``"answer"`` whose final number follows ``####``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import ValidationError
from ..jsonl import iter_records

__all__ = ["load_texts", "Task", "load_tasks", "final_number", "reference_number"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _records(path: str | os.PathLike[str]) -> list[tuple[int, dict]]:
    out = list(iter_records(path))
    if not out:
        raise ValidationError("no records; expected one JSON object per line", source=str(path))
    return out


def load_texts(path: str | os.PathLike[str]) -> list[str]:
    """Training texts from JSON Lines (``text`` | ``question``+``answer`` | ``prompt`` [+ ``completion``])."""
    texts = []
    for no, rec in _records(path):
        if isinstance(rec.get("text"), str):
            texts.append(rec["text"])
        elif isinstance(rec.get("question"), str) and isinstance(rec.get("answer"), str):
            texts.append(rec["question"] + "\n" + rec["answer"])
        elif isinstance(rec.get("prompt"), str) and isinstance(rec.get("completion", ""), str):
            texts.append(rec["prompt"] + rec.get("completion", ""))
        else:
            raise ValidationError('expected a string field "text", or "question"+"answer", or '
                                  '"prompt" (+ optional "completion")', source=str(path), record=no)
    return texts


@dataclass(frozen=True)
class Task:
    """One exact-match item: the prompt and the reference final number (as a normalised string)."""

    question: str
    reference: str


def reference_number(answer: str) -> str | None:
    """The number after ``####`` in a GSM8K answer, normalised (commas dropped), or ``None``."""
    if "####" not in answer:
        return None
    m = _NUMBER.search(answer.rsplit("####", 1)[1])
    return _normalise(m.group(0)) if m else None


def final_number(text: str) -> str | None:
    """The final number a model wrote (after ``####`` if present, else the last number), normalised."""
    ref = reference_number(text)
    if ref is not None:
        return ref
    found = _NUMBER.findall(text)
    return _normalise(found[-1]) if found else None


def _normalise(s: str) -> str:
    s = s.replace(",", "")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """GSM8K-format task records: ``question`` and ``answer`` with ``#### N``."""
    tasks = []
    for no, rec in _records(path):
        q, a = rec.get("question"), rec.get("answer")
        if not isinstance(q, str) or not isinstance(a, str):
            raise ValidationError('expected string fields "question" and "answer"', source=str(path), record=no)
        ref = reference_number(a)
        if ref is None:
            raise ValidationError('the answer must end in "#### <number>" (GSM8K format)', source=str(path),
                                  record=no)
        tasks.append(Task(q, ref))
    return tasks
