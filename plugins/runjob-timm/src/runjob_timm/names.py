"""The timm architecture names ``runjob validate`` checks ``model.arch`` against, without importing
torch or timm: ``architectures.txt`` beside this module, written from ``timm.list_models()`` by

    python -m runjob_timm.names            # rewrite architectures.txt from the installed timm
    python -m runjob_timm.names --check    # exit 1 when it differs from the installed timm

The file's first line names the timm version it was written from. Then one architecture a line,
followed by its pretrained tags (``timm.list_pretrained()``), and the deprecated names timm still
builds as ``old -> new``. Reading it (:func:`known`) needs neither torch nor timm.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

LIST = Path(__file__).with_name("architectures.txt")
HEADER = "# timm "


@dataclass(frozen=True)
class Architectures:
    """What ``architectures.txt`` holds."""

    version: str
    """The timm version the list was written from."""
    tags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Every architecture with its pretrained tags (none for an architecture without weights)."""
    deprecated: dict[str, str] = field(default_factory=dict)
    """Old names timm still builds, each with the name (``arch.tag``) it stands for now."""

    def close(self, name: str, n: int = 3) -> list[str]:
        """The known architectures (and deprecated names) nearest to ``name``."""
        return difflib.get_close_matches(name, [*self.tags, *self.deprecated], n=n, cutoff=0.6)


def parse(text: str) -> Architectures:
    """The architectures of a list's ``text``."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(HEADER):
        raise ValueError(f"not a runjob-timm architecture list: its first line is not '{HEADER}VERSION: ...'")
    version = lines[0].removeprefix(HEADER).split(":", 1)[0].strip()
    tags: dict[str, tuple[str, ...]] = {}
    deprecated: dict[str, str] = {}
    for line in lines[1:]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if " -> " in line:
            old, new = line.split(" -> ", 1)
            deprecated[old.strip()] = new.strip()
        else:
            arch, *arch_tags = line.split()
            tags[arch] = tuple(arch_tags)
    return Architectures(version, tags, deprecated)


@functools.cache
def known() -> Architectures:
    """The architectures of the shipped list (read once)."""
    return parse(LIST.read_text(encoding="utf-8"))


def installed_timm() -> str | None:
    """The installed timm's version, read from its metadata (no import), or None."""
    try:
        return metadata.version("timm")
    except metadata.PackageNotFoundError:
        return None


def render(version: str, architectures: list[str], pretrained: list[str], deprecated: dict[str, str]) -> str:
    """The text of ``architectures.txt``."""
    tags: dict[str, list[str]] = {arch: [] for arch in architectures}
    for name in pretrained:
        arch, _, tag = name.partition(".")
        if arch in tags and tag:
            tags[arch].append(tag)
    lines = [
        f"{HEADER}{version}: {len(architectures)} architectures (timm.list_models()), each with its pretrained tags "
        "(timm.list_pretrained()), then the deprecated names timm still builds (old -> new).",
        "# Written by `python -m runjob_timm.names`; `runjob validate` checks model.arch against it without timm.",
    ]
    lines += [" ".join([arch, *tags[arch]]) for arch in architectures]
    lines += [f"{old} -> {new}" for old, new in sorted(deprecated.items())]
    return "\n".join(lines) + "\n"


def from_timm() -> str:
    """The list as the installed timm gives it (imports timm)."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load timm
    import timm
    from timm.models import get_deprecated_models

    architectures = set(timm.list_models())
    deprecated = {old: new for old, new in get_deprecated_models().items() if new and old not in architectures}
    return render(timm.__version__, timm.list_models(), timm.list_pretrained(), deprecated)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runjob_timm.names",
        description=f"Write {LIST.name} (the timm architecture names runjob validate checks) from the installed timm.",
    )
    parser.add_argument("--check", action="store_true", help="only compare: exit 1 when the list is out of date")
    parser.add_argument("--output", type=Path, default=LIST, help=f"where to write (default: {LIST})")
    args = parser.parse_args(argv)
    text = from_timm()
    fresh = parse(text)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else ""
        if current == text:
            print(f"{args.output}: up to date with timm {fresh.version} ({len(fresh.tags)} architectures)")
            return 0
        print(f"{args.output}: out of date with timm {fresh.version}: run python -m runjob_timm.names", file=sys.stderr)
        return 1
    args.output.write_text(text, encoding="utf-8")
    print(f"{args.output}: {len(fresh.tags)} architectures of timm {fresh.version}, {len(fresh.deprecated)} deprecated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
