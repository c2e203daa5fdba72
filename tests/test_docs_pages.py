"""The site's pages (docs/) and the README as a reader copies from them: every TOML block is a job, or
a part of one, that ``runjob validate`` accepts; every Python block compiles; every file a page puts
in with ``--8<--`` exists (the shipped jobs themselves are validated by tests/test_cli.py's and the
runs' tests). .ci/run type-checks every Python block with mypy.

A plugin package's project file starts with the line ``# pyproject.toml`` and is only parsed. The
line before a block's fence may say how to check it:

- ``<!-- checked with the plugin PLUGIN -->``: a job naming a plugin's components is checked with
  that plugin loaded as ``-p`` loads it: PLUGIN is a file of the repository
  (``examples/runjob-tinymlp/src/runjob_tinymlp/__init__.py``) or ``snippet NAME``, the pages'
  ``# NAME/__init__.py`` (or ``# NAME.py``) block;
- ``<!-- checked without its files: REASON -->``: a job naming the reader's own files is checked
  completely but for those files' being there;
- ``<!-- not checked: REASON -->``: a block that is not meant to be valid (a mistake shown on purpose).
"""

from __future__ import annotations

import re
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomli_w
from helpers import REPO, documented_python

from runjob.errors import JobError
from runjob.host.plugin_host import load_plugins, local_plugins
from runjob.job.validation import load_resolved

PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
NOT_CHECKED = re.compile(r"<!--\s*not checked:\s*\S.*?-->\s*$")
WITH_PLUGIN = re.compile(r"<!--\s*checked with the plugin\s+(?P<plugin>.+?)\s*-->\s*$")
WITHOUT_FILES = re.compile(r"<!--\s*checked without its files:\s*\S.*?-->\s*$")
# what a job's check says of a file or folder that is not there
MISSING_FILE = re.compile(
    r"not found|no such file|does not exist|not a (file|folder|directory)|matches no|no file", re.I
)
# a fragment of a job (no [model] table, no extends) is checked on top of this job
BASE_JOB = REPO / "jobs" / "digits.toml"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    file: Path | None
    """The repository's file the block shows whole (``--8<-- "jobs/x.toml"``), else None."""
    plugin: str | None = None
    """What ``<!-- checked with the plugin PLUGIN -->`` names."""
    without_files: bool = False

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')


def included(body: str) -> Path | None:
    """The file a block shows with pymdownx.snippets, when it is the block's one line."""
    lines = body.strip().splitlines()
    found = SNIPPET.match(lines[0]) if len(lines) == 1 else None
    return REPO / found[1] if found else None


def blocks(lang: str) -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match["lang"] != lang:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            if NOT_CHECKED.search(before):
                continue
            line = text.count("\n", 0, match.start()) + 1
            plugin = WITH_PLUGIN.search(before)
            found.append(
                Block(
                    page,
                    line,
                    lang,
                    textwrap.dedent(match["body"]),
                    included(match["body"]),
                    plugin["plugin"] if plugin else None,
                    bool(WITHOUT_FILES.search(before)),
                )
            )
    return found


def as_job(body: str) -> str:
    """The block as a job file in a temporary folder: a relative ``extends`` is taken from the
    repository root (where the pages' commands run); a fragment (no ``extends``, not both ``[model]``
    and ``[dataset]``) is
    put on the digits job as a reader would put it on theirs: its tables added, and a table naming
    another component (``[dataset] name = "csv"``) in place of that job's."""
    extends = re.search(r'^extends\s*=\s*"([^"]+)"', body, re.M)
    if extends:
        base = Path(extends[1])
        if not base.is_absolute():
            body = body.replace(extends[0], f'extends = "{(REPO / base).as_posix()}"', 1)
        return body
    if re.search(r"^\[model\]", body, re.M) and re.search(r"^\[dataset\]", body, re.M):
        return body
    job = tomllib.loads(BASE_JOB.read_text(encoding="utf-8"))
    for table, values in tomllib.loads(body).items():
        base = job.get(table)
        renamed = (
            isinstance(values, dict)
            and "name" in values
            and isinstance(base, dict)
            and base.get("name") != values["name"]
        )
        if isinstance(values, dict) and isinstance(base, dict) and not renamed:
            job[table] = {**base, **values}
        else:
            job[table] = values
    return tomli_w.dumps(job)


TOML_BLOCKS = blocks("toml")


def test_the_pages_hold_jobs_to_check():
    assert len(TOML_BLOCKS) >= 8, [b.where for b in TOML_BLOCKS]


@pytest.fixture(scope="module")
def host():
    return load_plugins()


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=lambda b: b.where)
def test_each_job_in_the_pages_validates(block, host, tmp_path, monkeypatch):
    if block.body.startswith("# pyproject.toml"):  # a plugin package's project file, not a job
        assert "project" in tomllib.loads(block.body), block.where
        return
    monkeypatch.chdir(REPO)
    job = block.file or tmp_path / "job.toml"
    if block.file is None:
        job.write_text(as_job(block.body), encoding="utf-8")
    if block.plugin is not None:
        host = load_plugins(local=local_plugins([plugin_file(block, tmp_path)]))
    try:
        load_resolved(job, [], host)
    except JobError as error:
        # a shipped job names the data and runs the pages' commands make first (data/, runs/)
        without_files = block.without_files or block.file is not None
        left = [p for p in error.problems if not (without_files and MISSING_FILE.search(p.message))]
        if left:
            pytest.fail(f"{block.where}: the job does not validate:\n" + "\n".join(map(str, left)))


def plugin_file(block: Block, folder: Path) -> str:
    """The file ``-p`` would be given for the plugin a block is checked with."""
    name = block.plugin or ""
    if name.startswith("snippet "):
        module = name.removeprefix("snippet ").strip()
        try:
            _, source = documented_python(f"# {module}/__init__.py\n")
        except AssertionError:  # a plugin file, as -p takes one
            _, source = documented_python(f"# {module}.py")
        (folder / f"{module}.py").write_text(source, encoding="utf-8")
        return str(folder / f"{module}.py")
    assert (REPO / name).is_file(), f"{block.where}: no plugin file {name}"
    return str(REPO / name)


@pytest.mark.parametrize("block", blocks("python"), ids=lambda b: b.where)
def test_each_python_block_in_the_pages_compiles(block):
    source = block.file.read_text(encoding="utf-8") if block.file else block.body
    compile(source, block.where, "exec")


def test_each_file_a_page_puts_in_exists():
    missing = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            snippet = SNIPPET.match(line)
            if snippet and not (REPO / snippet[1]).is_file():
                missing.append(f"{page.relative_to(REPO)}:{number}: {snippet[1]}")
    assert missing == []


def test_the_readmes_links_lead_to_files():
    """The README is outside the site (mkdocs checks the pages' links): each relative link in it
    names a file of the repository."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [target.split("#")[0] for target in targets if not re.match(r"[a-z]+:", target)]
    assert relative, "the README links into the site"
    assert [target for target in relative if target and not (REPO / target).exists()] == []
