"""Prompt-side contamination diagnostics (B1, §5.6): what a probe set's prompts look like per category.

Per category (and arm, when the prompts carry one): the number of distinct
instruction templates (when recorded), of distinct 70-character prompt heads,
of distinct final lines, and the mean pairwise 5-gram Jaccard of the prompts.
A single template per category is a risk indicator, not a defect by itself.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from ..jsonl import iter_records
from .builder import PROBES_FILE
from .text import HEAD_CHARS, final_line, mean_pairwise_jaccard, prompt_head

__all__ = ["PromptStats", "PromptRecord", "read_prompts", "prompt_diagnostics"]


@dataclass(frozen=True)
class PromptRecord:
    """What the diagnostics need of one prompt."""

    request_id: str
    category: str
    prompt: str
    template: str | None = None
    arm: str | None = None
    split: str | None = None


@dataclass(frozen=True)
class PromptStats:
    """B1 figures of one (category, arm) group.

    Attributes
    ----------
    n_templates
        Distinct ``template`` values, or ``None`` when the prompts do not record their template.
    n_heads, n_finals
        Distinct first-70-character heads and distinct last non-blank lines.
    mean_jaccard
        Mean pairwise word 5-gram Jaccard over the group's prompts (``None`` below two prompts).
    """

    category: str
    arm: str | None
    n_records: int
    n_templates: int | None
    n_heads: int
    n_finals: int
    mean_jaccard: float | None
    head_chars: int = HEAD_CHARS
    split: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_prompts(path: str | os.PathLike[str]) -> tuple[PromptRecord, ...]:
    """Read prompts: a probe-set directory (its ``probes.jsonl``) or a JSON Lines file.

    Each record needs ``prompt`` (or ``text``) and ``category``; ``request_id``
    (or ``id``), ``template``, ``arm`` and ``split`` are optional.
    """
    p = Path(path)
    if p.is_dir():
        p = p / PROBES_FILE
        if not p.is_file():
            raise ValidationError(f"no {PROBES_FILE} here; expected a directory from `expertcache probe build` "
                                  "or a JSON Lines prompts file", source=str(path))
    src = str(p)
    out = []
    for line_no, rec in iter_records(p):
        prompt = rec.get("prompt", rec.get("text"))
        if not isinstance(prompt, str):
            raise ValidationError("expected a string 'prompt' (or 'text')", source=src, record=line_no, field="prompt")
        cat = rec.get("category")
        if not isinstance(cat, str) or not cat.strip():
            raise ValidationError("expected a non-empty 'category' string", source=src, record=line_no,
                                  field="category")
        tpl = rec.get("template")
        arm = rec.get("arm")
        rid = rec.get("request_id", rec.get("id", line_no))
        split = rec.get("split")
        out.append(PromptRecord(str(rid), cat, prompt, None if tpl is None else str(tpl),
                                None if arm is None else str(arm), None if split is None else str(split)))
    if not out:
        raise ValidationError("no prompt records found; expected one JSON object per line", source=src)
    return tuple(out)


def prompt_diagnostics(records: tuple[PromptRecord, ...] | list[PromptRecord],
                       by_split: bool = False) -> tuple[PromptStats, ...]:
    """B1 figures per (category, arm), or per (category, split, arm) cell with ``by_split``; sorted."""
    groups: dict[tuple[str, str, str], list[PromptRecord]] = {}
    for r in records:
        key = (r.category, (r.split or "") if by_split else "", r.arm or "")
        groups.setdefault(key, []).append(r)
    out = []
    for key in sorted(groups):
        rs = groups[key]
        templates = None if any(r.template is None for r in rs) else len({r.template for r in rs})
        out.append(PromptStats(key[0], rs[0].arm, len(rs), templates, len({prompt_head(r.prompt) for r in rs}),
                               len({final_line(r.prompt) for r in rs}),
                               mean_pairwise_jaccard([r.prompt for r in rs]),
                               split=rs[0].split if by_split else None))
    return tuple(out)
