"""``python -m shmvec.atari.releases``: which releases' code the native Atari paths were checked
against, read off PyPI's own files (a maintainer's tool: it runs ``pip``; nothing imports it).

With no option it downloads (``pip download --no-deps``, into ``--cache``) every release of
stable-baselines3, gymnasium and ale-py from the oldest the ``atari`` extra allows to the newest on the
index, reads the source of every method :data:`~shmvec.atari.fingerprints.KNOWN` lists out of each
wheel, and prints, per method, the runs of releases that share a fingerprint: ``checked`` when
:data:`KNOWN` holds it, ``NEW`` when not (then the exit status is 1). ``--diff`` adds, for each NEW
run, the difference of its source from the nearest checked release's. ``--installed`` prints the
fingerprints of the code installed here instead; ``--stacks`` the pins of each older stack CI runs
the exactness tests on (one line each, for ``.ci/run``). The procedure for a new release is in
:mod:`shmvec.atari.fingerprints`.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from shmvec.atari.fingerprints import (
    KNOWN,
    OLDEST,
    STACKS,
    distribution,
    installed,
    version_key,
)
from shmvec.native import fingerprint, fingerprint_source

_RELEASE = re.compile(r"^\d+\.\d+\.\d+$")  # final releases only: no pre-releases, no dev builds


def method_source(module_source: str, qualname: str) -> str | None:
    """The source of ``Class.method`` in a module's source, as ``inspect.getsource`` gives it
    (decorators included), or None when the class does not define it (it inherits it, or is absent)."""
    cls_name, _, method = qualname.rpartition(".")
    lines = module_source.splitlines(keepends=True)
    for node in ast.parse(module_source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method:
                    start = min([d.lineno for d in item.decorator_list] + [item.lineno])
                    return "".join(lines[start - 1 : item.end_lineno])
    return None


def _split(name: str) -> tuple[str, str]:
    """``module.Class.method`` -> (the module's path in a wheel, ``Class.method``)."""
    parts = name.split(".")
    return "/".join(parts[:-2]) + ".py", ".".join(parts[-2:])


def releases(dist: str) -> list[str]:
    """The final releases of ``dist`` on pip's index, from :data:`OLDEST` on, oldest first."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", dist], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"Available versions: (.*)", out)
    if found is None:
        raise SystemExit(f"pip index versions {dist}: no versions in its output:\n{out}")
    versions = [v.strip() for v in found.group(1).split(",") if _RELEASE.match(v.strip())]
    oldest = version_key(OLDEST[dist])
    return sorted((v for v in versions if version_key(v) >= oldest), key=version_key)


def wheel(dist: str, version: str, cache: Path) -> Path:
    """A wheel of ``dist==version`` for this interpreter and platform, downloaded once into ``cache``."""
    folder = cache / dist
    stem = dist.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
        subprocess.run([*cmd, f"{dist}=={version}", "-d", str(folder)], check=True)
        found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def fingerprints_in(path: Path, names: Sequence[str]) -> dict[str, tuple[str | None, str | None]]:
    """Per method of ``names``: (its fingerprint, its source) in the wheel at ``path`` (None, None
    where the wheel's class does not define it)."""
    out: dict[str, tuple[str | None, str | None]] = {}
    with zipfile.ZipFile(path) as whl:
        for name in names:
            module, qualname = _split(name)
            try:
                source = method_source(whl.read(module).decode(), qualname)
            except KeyError:
                source = None
            out[name] = (None if source is None else fingerprint_source(source), source)
    return out


def survey(cache: Path, diff: bool) -> int:
    """Print the table of the module docstring; 1 when a release holds code :data:`KNOWN` lacks, or
    :data:`KNOWN` gives a code other releases than the index's."""
    new = 0
    by_dist: dict[str, list[str]] = {}
    for name in KNOWN:
        by_dist.setdefault(distribution(name), []).append(name)
    for dist, names in by_dist.items():
        versions = releases(dist)
        found = [fingerprints_in(wheel(dist, v, cache), names) for v in versions]
        for name in names:
            print(name)
            runs: list[list[int]] = []  # indices into versions, one list per run of equal code
            for i, codes in enumerate(found):
                if runs and found[runs[-1][0]][name][0] == codes[name][0]:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            checked = [run[0] for run in runs if found[run[0]][name][0] in KNOWN[name]]
            for run in runs:
                code, source = found[run[0]][name]
                span_known = KNOWN[name].get(code or "")
                known = span_known is not None
                new += not known
                span = "-".join(dict.fromkeys((versions[run[0]], versions[run[-1]])))
                label = "checked" if known else "NEW" if code else "NEW (not defined by the class here)"
                if span_known is not None and span_known != (versions[run[0]], versions[run[-1]]):
                    new += 1  # KNOWN's releases of this code must be what the index holds
                    label = f"checked, but KNOWN says {'-'.join(span_known)}"
                print(f"    {dist} {span:<16} {code or '-':<16}  {label}")
                if diff and not known and checked:
                    near = min(checked, key=lambda i: abs(i - run[0]))
                    before, after = (found[near][name][1] or "").splitlines(), (source or "").splitlines()
                    lines = difflib.unified_diff(before, after, versions[near], versions[run[0]], lineterm="")
                    print("\n".join("        " + line for line in lines))
    print(f"\n{new} run(s) of releases differ from KNOWN" if new else "\nevery release's code is checked")
    return 1 if new else 0


def installed_table() -> int:
    """Print the fingerprint of each restated method as installed here, and whether it is checked."""
    unknown = 0
    for name in KNOWN:
        dist = distribution(name)
        module_name, cls_name, method = name.rsplit(".", 2)
        try:
            func = getattr(getattr(importlib.import_module(module_name), cls_name), method)
            code = fingerprint(func)
        except (ImportError, AttributeError):
            code = None
        label = "checked" if code in KNOWN[name] else "not installed" if code is None else "NOT CHECKED"
        unknown += label == "NOT CHECKED"
        print(f"{name}\n    {dist} {installed(dist):<12} {code or '-':<16}  {label}")
    return 1 if unknown else 0


def main(argv: Sequence[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m shmvec.atari.releases", description=doc)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "shmvec-releases")
    parser.add_argument("--diff", action="store_true", help="show how each NEW run's source differs")
    parser.add_argument("--installed", action="store_true", help="the code installed here, not PyPI's")
    parser.add_argument("--stacks", action="store_true", help="print the pins of CI's older stacks")
    args = parser.parse_args(argv)
    if args.stacks:
        for stack in STACKS[:-1]:
            print(" ".join(f"{dist}=={version}" for dist, version in stack.items()))
        return 0
    if args.installed:
        return installed_table()
    return survey(args.cache, args.diff)


if __name__ == "__main__":
    raise SystemExit(main())
