"""Regenerate the bundled example payloads from the Python standard library's docstrings.

The shipped files in ``examples/`` were produced by this script (Python 3.11)
and are committed, so builds never depend on the running interpreter. The
payloads are docstrings of the CPython standard library, distributed under the
Python Software Foundation License (PSF-2.0); each record says so in its
``licence`` field. Run from the repository root::

    python src/expertcache/probes/data/harvest_stdlib.py

Four archetypes, each record ``{"id", "group", "payload", "family", "licence"}``
with the module as the source group (records of one module never straddle the
discovery/confirmatory split):

- ``module_overview``: a module's docstring (prose);
- ``function_reference``: a function's docstring (prose);
- ``class_reference``: a class's docstring (prose);
- ``api_call``: a structured record (module, name, signature, summary).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import warnings
from pathlib import Path

MODULES = sorted("""
abc argparse ast base64 bisect bz2 calendar cmath codecs collections colorsys concurrent.futures
configparser contextlib copy csv dataclasses datetime decimal difflib dis email email.message
enum filecmp fnmatch fractions ftplib functools getopt gettext glob graphlib gzip hashlib heapq
hmac html html.parser http.client http.cookies imaplib inspect io ipaddress itertools json
keyword linecache locale logging lzma mailbox mimetypes netrc numbers operator optparse os.path
pathlib pickle pickletools pkgutil platform plistlib poplib pprint profile pstats queue quopri
random re reprlib sched secrets selectors shelve shlex shutil smtplib socket sqlite3 statistics
string stringprep struct subprocess symtable tabnanny tarfile tempfile textwrap threading
timeit token tokenize trace traceback tracemalloc types typing unittest urllib.parse
urllib.request uuid warnings wave weakref xml.dom.minidom xml.etree.ElementTree zipfile zipimport
""".split())
LICENCE = "PSF-2.0 (CPython standard library docstring)"
PER_ARCHETYPE = 48
PER_MODULE = 2
MAX_CHARS = 700


def _clean(doc: str) -> str:
    doc = inspect.cleandoc(doc)
    doc = re.sub(r"\n{3,}", "\n\n", doc).strip()
    if len(doc) > MAX_CHARS:  # cut at a paragraph or sentence boundary
        cut = doc.rfind("\n\n", 0, MAX_CHARS)
        if cut < MAX_CHARS // 2:
            cut = doc.rfind(". ", 0, MAX_CHARS) + 1
        doc = doc[:cut].strip() if cut > 0 else doc[:MAX_CHARS].strip()
    return doc


def harvest() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"module_overview": [], "function_reference": [], "class_reference": [],
                                  "api_call": []}
    for name in MODULES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - platform-specific modules are skipped
                continue
        if mod.__doc__ and len(mod.__doc__) >= 200:
            out["module_overview"].append({"id": name, "group": name, "payload": _clean(mod.__doc__)})
        n_fun = n_cls = n_api = 0
        for attr in sorted(vars(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr)
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            doc = inspect.getdoc(obj) or ""
            if inspect.isfunction(obj) and len(doc) >= 200 and n_fun < PER_MODULE:
                out["function_reference"].append({"id": f"{name}.{attr}", "group": name, "payload": _clean(doc)})
                n_fun += 1
            if inspect.isclass(obj) and len(doc) >= 200 and n_cls < PER_MODULE:
                out["class_reference"].append({"id": f"{name}.{attr}", "group": name, "payload": _clean(doc)})
                n_cls += 1
            if inspect.isfunction(obj) and doc and n_api < PER_MODULE:
                try:
                    sig = str(inspect.signature(obj))
                except (TypeError, ValueError):
                    continue
                out["api_call"].append({"id": f"{name}.{attr}", "group": name, "payload": {
                    "module": name, "name": attr, "signature": f"{attr}{sig}", "summary": doc.splitlines()[0]}})
                n_api += 1
    for recs in out.values():
        for r in recs:
            r["family"] = "python-stdlib"
            r["licence"] = LICENCE
    return {k: v[:PER_ARCHETYPE] for k, v in out.items()}


def main() -> None:
    target = Path(__file__).resolve().parent / "examples"
    target.mkdir(exist_ok=True)
    for archetype, records in harvest().items():
        path = target / f"{archetype}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records),
                        encoding="utf-8")
        print(f"{path}: {len(records)} records, {len({r['group'] for r in records})} groups "
              f"(python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
