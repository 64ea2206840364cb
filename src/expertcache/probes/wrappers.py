"""Prompt wrappers as data: forms, languages, framings, payload styles, the fixed template (§3.4, §5.6).

The bundled ``data/wrappers.json`` documents the format in its ``_doc`` field;
users copy and extend it and pass it with ``--wrappers``. Loading checks
everything the builder relies on, so a bad file fails before any work.
"""

from __future__ import annotations

import json
import os
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from .text import final_line

__all__ = ["Form", "Framing", "Style", "Wrappers", "load_wrappers", "default_wrappers_path", "DEFAULT_FRAMINGS"]

#: Key of the framings that apply to archetypes without their own list.
DEFAULT_FRAMINGS = "_default"


@dataclass(frozen=True)
class Form:
    """A structurally distinct prompt form; ``templates`` maps language -> format string."""

    name: str
    final_kind: str
    templates: dict[str, str]


@dataclass(frozen=True)
class Framing:
    """A task framing: the instruction text per language."""

    name: str
    text: dict[str, str]


@dataclass(frozen=True)
class Style:
    """A payload rendering style (literal strings plus one per-field format string)."""

    name: str
    before: str = ""
    after: str = ""
    line_prefix: str = ""
    item: str = "{key}: {value}"
    joiner: str = "\n"
    record_before: str | None = None
    record_after: str | None = None

    def render(self, payload: str | dict[str, Any]) -> str:
        """Render a text payload (line by line) or a record payload (field by field).

        >>> Style("q", line_prefix="> ").render("a\\nb")
        '> a\\n> b'
        >>> Style("kv", item="{key}={value_json}", joiner=", ").render({"x": 1, "y": "z"})
        'x=1, y="z"'
        """
        if isinstance(payload, dict):
            body = self.joiner.join(
                self.item.format(key=k, value=v, key_json=json.dumps(k, ensure_ascii=False),
                                 value_json=json.dumps(v, ensure_ascii=False))
                for k, v in payload.items())
            before = self.before if self.record_before is None else self.record_before
            after = self.after if self.record_after is None else self.record_after
        else:
            body = "\n".join(self.line_prefix + line if line else line.rstrip() or self.line_prefix.rstrip()
                             for line in payload.splitlines())
            before, after = self.before, self.after
        return "\n".join(part for part in (before, body, after) if part)


@dataclass(frozen=True)
class Wrappers:
    """Everything the builder renders with."""

    languages: tuple[str, ...]
    forms: tuple[Form, ...]
    framings: dict[str, tuple[Framing, ...]]
    styles: tuple[Style, ...]
    fixed_template: str
    fixed_language: str
    fixed_style: str
    source: str

    def framings_for(self, archetype: str) -> tuple[Framing, ...]:
        """The archetype's own framings, else the ``_default`` list."""
        return self.framings.get(archetype, self.framings[DEFAULT_FRAMINGS])

    def style(self, name: str) -> Style:
        """The style called ``name``."""
        for s in self.styles:
            if s.name == name:
                return s
        raise KeyError(name)


def default_wrappers_path() -> Path:
    """Path of the bundled ``wrappers.json``."""
    return Path(str(resources.files("expertcache.probes") / "data" / "wrappers.json"))


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}


def load_wrappers(path: str | os.PathLike[str] | None = None) -> Wrappers:
    """Read and check a wrappers file (the bundled one when ``path`` is ``None``).

    Raises
    ------
    ValidationError
        Naming the file and the offending entry: a missing language, a
        template without ``{instruction}``/``{payload}`` or with another
        placeholder, two forms with the same final kind or final line, a
        duplicate name, or a style with a bad item template.
    """
    p = Path(path) if path is not None else default_wrappers_path()
    src = str(p)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValidationError("wrappers file not found", source=src) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationError(f"not valid JSON ({exc})", source=src) from None
    if not isinstance(raw, dict):
        raise ValidationError("expected a JSON object with languages, forms, framings, styles, fixed", source=src)
    for key in ("languages", "forms", "framings", "styles", "fixed"):
        if key not in raw:
            raise ValidationError("missing section; see the bundled wrappers.json for the format", source=src,
                                  field=key)
    langs = raw["languages"]
    if not isinstance(langs, list) or not langs or not all(isinstance(x, str) and x for x in langs) \
            or len(set(langs)) != len(langs):
        raise ValidationError(f"expected a non-empty list of distinct language codes; got {langs!r}",
                              source=src, field="languages")

    def texts(obj: Any, where: str, need: set[str]) -> dict[str, str]:
        if not isinstance(obj, dict):
            raise ValidationError(f"expected an object mapping language -> text; got {obj!r}", source=src,
                                  field=where)
        missing = [lang for lang in langs if not isinstance(obj.get(lang), str) or not obj[lang].strip()]
        if missing:
            raise ValidationError(f"no text for language(s) {', '.join(missing)}", source=src, field=where)
        for lang in langs:
            got = _fields(obj[lang])
            if got != need:
                raise ValidationError(f"{lang} template must use exactly the placeholders "
                                      f"{sorted(need) or 'none'}; got {sorted(got) or 'none'} "
                                      "(write literal braces as {{ and }})", source=src, field=where)
        return {lang: obj[lang] for lang in langs}

    forms: list[Form] = []
    if not isinstance(raw["forms"], list) or not raw["forms"]:
        raise ValidationError("expected a non-empty list of forms", source=src, field="forms")
    for i, f in enumerate(raw["forms"]):
        where = f"forms[{i}]"
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("final_kind"), str):
            raise ValidationError("expected {\"name\", \"final_kind\", \"templates\"}", source=src, field=where)
        forms.append(Form(f["name"], f["final_kind"],
                          texts(f.get("templates"), f"{where}.templates", {"instruction", "payload"})))
    _unique([f.name for f in forms], "form name", src)
    _unique([f.final_kind for f in forms], "form final_kind (each form must end in a different kind of line)", src)
    for lang in langs:
        finals = [final_line(f.templates[lang].format(instruction="\x00", payload="\x00")) for f in forms]
        _unique(finals, f"final line of the {lang} forms", src)

    if not isinstance(raw["framings"], dict) or DEFAULT_FRAMINGS not in raw["framings"]:
        raise ValidationError(f"expected an object with a {DEFAULT_FRAMINGS!r} list", source=src, field="framings")
    framings: dict[str, tuple[Framing, ...]] = {}
    for arch, lst in raw["framings"].items():
        where = f"framings.{arch}"
        if not isinstance(lst, list) or not lst:
            raise ValidationError("expected a non-empty list of framings", source=src, field=where)
        items = []
        for j, fr in enumerate(lst):
            if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                raise ValidationError("expected {\"name\", \"text\"}", source=src, field=f"{where}[{j}]")
            items.append(Framing(fr["name"], texts(fr.get("text"), f"{where}[{j}].text", set())))
        _unique([x.name for x in items], f"framing name in {where}", src)
        framings[arch] = tuple(items)

    styles: list[Style] = []
    allowed = {"name", "before", "after", "line_prefix", "item", "joiner", "record_before", "record_after"}
    if not isinstance(raw["styles"], list) or not raw["styles"]:
        raise ValidationError("expected a non-empty list of styles", source=src, field="styles")
    for i, s in enumerate(raw["styles"]):
        where = f"styles[{i}]"
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or set(s) - allowed \
                or not all(isinstance(v, str) for v in s.values()):
            raise ValidationError(f"expected string fields among {sorted(allowed)} with a name", source=src,
                                  field=where)
        item = s.get("item", "{key}: {value}")
        if not _fields(item) <= {"key", "value", "key_json", "value_json"}:
            raise ValidationError(f"item may use {{key}}, {{value}}, {{key_json}}, {{value_json}}; got {item!r}",
                                  source=src, field=where)
        styles.append(Style(**s))
    _unique([s.name for s in styles], "style name", src)

    fx = raw["fixed"]
    if not isinstance(fx, dict) or not isinstance(fx.get("template"), str):
        raise ValidationError("expected {\"template\", \"language\", \"style\"}", source=src, field="fixed")
    if _fields(fx["template"]) != {"payload"}:
        raise ValidationError("the fixed template must use exactly the placeholder {payload}", source=src,
                              field="fixed.template")
    if fx.get("style") not in {s.name for s in styles}:
        raise ValidationError(f"unknown style {fx.get('style')!r}", source=src, field="fixed.style")
    return Wrappers(tuple(langs), tuple(forms), framings, tuple(styles), fx["template"],
                    str(fx.get("language", langs[0])), fx["style"], src)


def _unique(values: list[str], what: str, src: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ValidationError(f"duplicate {what}: {v!r}", source=src)
        seen.add(v)
