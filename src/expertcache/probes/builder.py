"""The diversity-controlled probe-set builder (§3.4, §5.6) with its matched-pair control arm (§5.5).

For every archetype (one payload source file) and split (discovery,
confirmatory) the builder selects ``per_cell`` payloads and renders each with
a different (form, language) pair, a task framing and a payload style:

1. **Group-aware split.** The archetype's source groups are shuffled (seeded)
   and each goes to the split with fewer records so far, so no group is on
   both sides.
2. **Near-duplicate rejection.** Within a split, records are visited in a
   seeded order; one is selected only if its payload's 5-gram Jaccard
   (:mod:`expertcache.probes.text`) with every payload already selected
   anywhere in the probe set is at most ``threshold`` (default 0.30).
3. **Rendering.** The cell's records take distinct (form, language) pairs
   (a seeded permutation of all pairs, so ``per_cell`` may not exceed
   ``forms x languages``); framings and styles cycle through seeded
   permutations.
4. **Matched-pair arm.** The first ``n_matched`` selected records of each cell
   are rendered again with the single fixed template (``arm = "fixed"``),
   paired with their diverse rendering by ``source_id``.

Everything is drawn from ``numpy.random.default_rng([seed, crc32(archetype)])``:
the same sources, wrappers and seed give byte-identical output.
"""

from __future__ import annotations

import csv
import io
import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import ValidationError
from ..storage import atomic_directory, json_text, sha256_file
from .sources import Payload, discover_sources, example_sources_dir, read_sources
from .text import jaccard, ngrams
from .wrappers import Wrappers, load_wrappers

__all__ = ["BuildConfig", "ProbeRecord", "ProbeSet", "build_probe_set", "write_probe_set", "SPLITS",
           "PROBES_FILE", "PROMPTS_FILE", "LABELS_FILE"]

SPLITS = ("discovery", "confirmatory")
PROBES_FILE = "probes.jsonl"
PROMPTS_FILE = "prompts.jsonl"
LABELS_FILE = "labels.csv"
MANIFEST_FILE = "manifest.json"
_KIND = "probe_set"


@dataclass(frozen=True)
class BuildConfig:
    """Parameters of :func:`build_probe_set`.

    Attributes
    ----------
    per_cell
        Diverse-arm records per (archetype, split) cell; at most forms x languages.
    n_matched
        Records per cell also rendered with the fixed template (matched-pair arm); 0 disables it.
    threshold
        Maximum 5-gram Jaccard between a selected payload and every earlier one, in ``[0, 1]``.
    seed
        Seed of every random choice.
    """

    per_cell: int = 12
    n_matched: int = 4
    threshold: float = 0.30
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.per_cell, bool) or not isinstance(self.per_cell, int) or self.per_cell < 1:
            raise ValidationError(f"per_cell must be a positive integer; got {self.per_cell!r}", field="per_cell")
        if isinstance(self.n_matched, bool) or not isinstance(self.n_matched, int) \
                or not 0 <= self.n_matched <= self.per_cell:
            raise ValidationError(f"n_matched must be an integer in [0, per_cell={self.per_cell}]; "
                                  f"got {self.n_matched!r}", field="n_matched")
        if not isinstance(self.threshold, (int, float)) or not 0.0 <= self.threshold <= 1.0:
            raise ValidationError(f"threshold must be in [0, 1]; got {self.threshold!r}", field="threshold")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValidationError(f"seed must be a non-negative integer; got {self.seed!r}", field="seed")


@dataclass(frozen=True)
class ProbeRecord:
    """One rendered prompt. ``category`` is the archetype; ``template`` is ``form/language`` or ``fixed``."""

    request_id: str
    category: str
    split: str
    arm: str
    prompt: str
    source_id: str
    source_group: str
    source_family: str
    form: str
    language: str
    framing: str
    style: str
    template: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProbeSet:
    """A built probe set: the records (diverse arm then fixed arm, per cell) and its manifest."""

    records: tuple[ProbeRecord, ...]
    manifest: dict[str, Any] = field(default_factory=dict)

    def labels_csv(self) -> str:
        """``request_id,category,arm,source_id,split`` rows: a labels file for ``expertcache audit``."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["request_id", "category", "arm", "source_id", "split"])
        for r in self.records:
            w.writerow([r.request_id, r.category, r.arm, r.source_id, r.split])
        return buf.getvalue()

    def probes_jsonl(self) -> str:
        """One JSON object per record with every field (sorted keys)."""
        return "".join(json.dumps(r.to_dict(), ensure_ascii=False, sort_keys=True) + "\n" for r in self.records)

    def prompts_jsonl(self) -> str:
        """``{"id", "prompt", "category"}`` per record: the input of ``expertcache collect --prompts``."""
        return "".join(json.dumps({"id": r.request_id, "prompt": r.prompt, "category": r.category},
                                  ensure_ascii=False, sort_keys=True) + "\n" for r in self.records)


def _rng(seed: int, archetype: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(archetype.encode("utf-8"))])


def _split_groups(payloads: tuple[Payload, ...], rng: np.random.Generator) -> dict[str, list[Payload]]:
    groups = sorted({p.group for p in payloads})
    size = {g: 0 for g in groups}
    for p in payloads:
        size[p.group] += 1
    side: dict[str, str] = {}
    count = {s: 0 for s in SPLITS}
    for gi in rng.permutation(len(groups)):
        g = groups[int(gi)]
        s = min(SPLITS, key=lambda x: (count[x], SPLITS.index(x)))
        side[g] = s
        count[s] += size[g]
    return {s: [p for p in payloads if side[p.group] == s] for s in SPLITS}


def build_probe_set(sources: dict[str, str | os.PathLike[str]] | str | os.PathLike[str] | None = None,
                    wrappers: Wrappers | str | os.PathLike[str] | None = None,
                    config: BuildConfig = BuildConfig()) -> ProbeSet:
    """Build a probe set from payload sources (§3.4, §5.6).

    Parameters
    ----------
    sources
        ``{archetype: file}``, a directory of ``ARCHETYPE.jsonl|csv`` files, or
        ``None`` for the bundled examples (Python standard-library docstrings).
    wrappers
        A :class:`Wrappers`, a wrappers file, or ``None`` for the bundled one.
    config
        Cell size, matched-arm size, Jaccard threshold and seed.

    Raises
    ------
    ValidationError
        On bad sources or wrappers, or when a cell cannot be filled: the
        message names every short (archetype, split) cell and how many
        payloads it misses.
    """
    if sources is None:
        sources = discover_sources(example_sources_dir())
    elif not isinstance(sources, dict):
        sources = discover_sources(sources)
    paths = {k: Path(v) for k, v in sources.items()}
    data = read_sources(paths)
    wr = wrappers if isinstance(wrappers, Wrappers) else load_wrappers(wrappers)
    pairs = [(f, lang) for f in wr.forms for lang in wr.languages]
    if config.per_cell > len(pairs):
        raise ValidationError(f"per_cell={config.per_cell} exceeds the {len(wr.forms)} forms x "
                              f"{len(wr.languages)} languages = {len(pairs)} distinct (form, language) pairs; "
                              "lower --per-cell or add forms/languages to the wrappers file", field="per_cell")
    selected_grams: list[frozenset] = []
    shortfalls: list[str] = []
    records: list[ProbeRecord] = []
    cells: dict[str, dict[str, int]] = {}
    fixed_style = wr.style(wr.fixed_style)
    for arch in sorted(data):
        rng = _rng(config.seed, arch)
        sides = _split_groups(data[arch], rng)
        framings = wr.framings_for(arch)
        for split in SPLITS:
            pool = sides[split]
            chosen: list[Payload] = []
            rejected = 0
            for idx in rng.permutation(len(pool)):
                if len(chosen) == config.per_cell:
                    break
                cand = pool[int(idx)]
                grams = ngrams(cand.text)
                if any(jaccard(grams, g) > config.threshold for g in selected_grams):
                    rejected += 1
                    continue
                selected_grams.append(grams)
                chosen.append(cand)
            if len(chosen) < config.per_cell:
                shortfalls.append(
                    f"archetype {arch!r}, split {split!r}: {len(chosen)} of {config.per_cell} payloads, "
                    f"{config.per_cell - len(chosen)} missing ({len(pool)} records in its source groups, "
                    f"{rejected} rejected by the 5-gram Jaccard filter at {config.threshold:g})")
                continue
            pair_order = rng.permutation(len(pairs))
            frame_order = rng.permutation(len(framings))
            style_order = rng.permutation(len(wr.styles))
            code = split[0]
            for i, p in enumerate(chosen):
                form, lang = pairs[int(pair_order[i])]
                framing = framings[int(frame_order[i % len(framings)])]
                style = wr.styles[int(style_order[i % len(wr.styles)])]
                prompt = form.templates[lang].format(instruction=framing.text[lang], payload=style.render(p.payload))
                records.append(ProbeRecord(f"{arch}-{code}{i:03d}", arch, split, "diverse", prompt, p.id, p.group,
                                           p.family, form.name, lang, framing.name, style.name,
                                           f"{form.name}/{lang}"))
            for i, p in enumerate(chosen[:config.n_matched]):
                prompt = wr.fixed_template.format(payload=fixed_style.render(p.payload))
                records.append(ProbeRecord(f"{arch}-{code}{i:03d}-fixed", arch, split, "fixed", prompt, p.id,
                                           p.group, p.family, "fixed", wr.fixed_language, "fixed", fixed_style.name,
                                           "fixed"))
            cells.setdefault(arch, {})[split] = len(chosen)
    if shortfalls:
        raise ValidationError("cannot fill every cell: " + "; ".join(shortfalls)
                              + ". Add payloads (from new source groups), raise --threshold or lower --per-cell")
    manifest = {
        "kind": _KIND,
        "tool_version": __version__,
        "config": asdict(config),
        "wrappers": {"file": Path(wr.source).name, "sha256": sha256_file(Path(wr.source)),
                     "forms": len(wr.forms), "languages": list(wr.languages), "styles": len(wr.styles)},
        "sources": {a: {"file": paths[a].name, "sha256": sha256_file(paths[a]), "records": len(data[a])}
                    for a in sorted(data)},
        "cells": cells,
        "n_records": len(records),
        "n_fixed": sum(r.arm == "fixed" for r in records),
    }
    return ProbeSet(tuple(records), manifest)


def write_probe_set(probe_set: ProbeSet, out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write ``probes.jsonl`` (every field), ``prompts.jsonl`` (for ``expertcache collect``), ``labels.csv``
    and ``manifest.json`` (with their sha256) to ``out``, atomically."""
    with atomic_directory(out, overwrite=overwrite) as tmp:
        files = {}
        for name, body in ((PROBES_FILE, probe_set.probes_jsonl()), (PROMPTS_FILE, probe_set.prompts_jsonl()),
                           (LABELS_FILE, probe_set.labels_csv())):
            (tmp / name).write_text(body, encoding="utf-8", newline="\n")
            files[name] = {"sha256": sha256_file(tmp / name)}
        manifest = {**probe_set.manifest, "files": files}
        (tmp / MANIFEST_FILE).write_text(json_text(manifest, indent=2) + "\n", encoding="utf-8")
    return Path(out)
