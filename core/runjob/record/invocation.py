"""How the user started runjob: the words a command runjob prints for pasting starts with.

``uv run runjob JOB`` leaves ``runjob`` off the user's PATH (uv puts the project's ``.venv/bin``
on it for its child only): a printed ``runjob JOB --resume`` fails there with exit 127. So a
printed command repeats how this process was started:

- under a launcher or wrapper that the user typed (``uv run``, ``torchrun``, ``python -m
  torch.distributed.run``, ``accelerate launch``): that command, up to runjob's own arguments, read
  from the parent process's command line (and its parent's: ``uv run torchrun ... -m runjob``);
  a parent counts when it is one of :data:`WRAPPERS` and its command line ends with this process's
  arguments;
- ``python -m runjob``: the interpreter as it was given, ``-m runjob``;
- the ``runjob`` script: ``runjob`` where that name on the PATH is this very file, else the path
  it was started by (``/path/.venv/bin/runjob``). Under ``uv run`` (``$UV`` set), the
  environment's own ``bin`` folder on the PATH is uv's doing, not the user's: paths there stay
  whole;
- anything else (the library called from a notebook or a test): ``runjob``.

A process that runjob starts itself (the workers of ``runjob JOB --num-processes N``) gets the
answer of the process that started it in :data:`ENVIRONMENT`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

ENVIRONMENT = "RUNJOB_COMMAND"
"""The words that start runjob (``shlex.join``-ed), set for the processes runjob starts itself."""

WRAPPERS = frozenset({"uv", "torchrun", "accelerate", "accelerate-launch"})
"""Programs whose command line, typed by the user, ends with the command they start."""
WRAPPER_MODULES = frozenset(
    {"torch.distributed.run", "accelerate.commands.launch", "accelerate.commands.accelerate_cli"}
)
"""The same, run as ``python -m MODULE``."""

MAX_ANCESTORS = 4  # uv run accelerate launch ... -m runjob: three wrappers deep at most, in practice
_PYTHON = re.compile(r"python[0-9.]*$")
_TAKES_VALUE = frozenset({"-X", "-W", "-Q"})  # interpreter options with a value of their own


def command_prefix() -> list[str]:
    """The words that start runjob as the user started this process: see the module docstring."""
    given = os.environ.get(ENVIRONMENT, "").strip()
    if given:
        return shlex.split(given)
    own = _own_words()
    if own is None:  # runjob is not the program: its library, called from a notebook or a test
        return ["runjob"]
    return detect(own, sys.argv[1:], _ancestors(), os.environ)


def pasteable(*words: str | os.PathLike[str]) -> str:
    """``runjob WORDS`` started as this process was (``uv run runjob sync DIR``...), quoted for a shell."""
    return shlex.join([*command_prefix(), *map(str, words)])


def detect(
    own: Sequence[str],
    arguments: Sequence[str],
    ancestors: Iterable[Sequence[str]],
    environ: Mapping[str, str],
    which: Callable[..., str | None] = shutil.which,
    is_script: Callable[[str], bool] | None = None,
) -> list[str]:
    """The words before runjob's ``arguments`` in the command the user typed.

    ``own``: how this process would be started on its own (:func:`_own_words`); ``arguments``: its
    arguments (``sys.argv[1:]``); ``ancestors``: the command lines of its parent, grandparent...
    (as the system shows them: a script run through its ``#!`` line shows the interpreter first);
    ``environ``: this process's environment; ``which`` and ``is_script`` are
    :func:`shutil.which` and :func:`_is_script`, given by tests."""
    is_script = is_script or _is_script
    prefix, tail = list(own), list(arguments)
    for cmdline in list(ancestors)[:MAX_ANCESTORS]:
        words = _as_typed(cmdline, is_script)
        program, rest = _split_program(words)
        if not program or not _is_wrapper(program, environ, which) or not _ends_with(words, tail):
            break
        prefix = words[: len(words) - len(arguments)]
        tail = rest  # the next ancestor must end with this one's arguments (uv run torchrun ...)
    return _shortened(prefix, environ, which)


def _own_words() -> list[str] | None:
    """How this process was started, without its arguments: ``[interpreter, "-m", "runjob"]`` or
    the runjob script's path; None when runjob is not the program (a notebook, a test)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in ("runjob.__main__", "runjob"):
        interpreter = sys.orig_argv[0] if sys.orig_argv else sys.executable
        return [interpreter, "-m", "runjob"]
    script = sys.argv[0] if sys.argv else ""
    if spec is None and os.path.basename(script) == "runjob":
        return [script]
    return None


def _ancestors() -> list[list[str]]:
    """The command lines of this process's parent, grandparent... (those that can be read)."""
    import psutil  # lazy: `runjob validate` imports this module: psutil only when used

    found: list[list[str]] = []
    try:
        process = psutil.Process().parent()
        while process is not None and len(found) < MAX_ANCESTORS:  # pid 1 too: `docker run IMAGE uv run ...`
            found.append(process.cmdline())
            process = process.parent()
    except psutil.Error:  # gone, or another user's
        pass
    return found


def _is_script(path: str) -> bool:
    """Whether ``path`` is an executable file that starts with ``#!`` (a console script)."""
    try:
        with open(path, "rb") as file:
            return file.read(2) == b"#!" and os.access(path, os.X_OK)
    except OSError:
        return False


def _as_typed(cmdline: Sequence[str], is_script: Callable[[str], bool]) -> list[str]:
    """``cmdline`` as typed: ``python /venv/bin/torchrun ...``, which the system shows for the
    script ``torchrun`` run through its ``#!`` line, becomes ``/venv/bin/torchrun ...``."""
    words = list(cmdline)
    if len(words) > 1 and _PYTHON.match(os.path.basename(words[0])) and not words[1].startswith("-"):
        if is_script(words[1]):
            return words[1:]
    return words


def _split_program(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(program, arguments)``: ``[python, -m, module]`` or ``[python, script.py]`` (interpreter
    options included) or the first word, and the words after."""
    if not words:
        return [], []
    if not _PYTHON.match(os.path.basename(words[0])):
        return list(words[:1]), list(words[1:])
    at = 1
    while at < len(words) and words[at].startswith("-") and words[at] not in ("-m", "-c", "-"):
        at += 2 if words[at] in _TAKES_VALUE else 1
    end = at + 2 if at < len(words) and words[at] in ("-m", "-c") else at + 1
    return list(words[:end]), list(words[end:])


def _is_wrapper(program: Sequence[str], environ: Mapping[str, str], which: Callable[..., str | None]) -> bool:
    if len(program) >= 3 and program[-2] == "-m":
        return program[-1] in WRAPPER_MODULES
    name = os.path.basename(program[-1])
    if name in WRAPPERS:
        return True
    uv = environ.get("UV")  # the uv that started a process under it (uv run), whatever its file is called
    return uv is not None and uv != "" and len(program) == 1 and _same_path(program[0], uv, environ, which)


def _same_path(word: str, path: str, environ: Mapping[str, str], which: Callable[..., str | None]) -> bool:
    found = word if os.sep in word else which(word, path=environ.get("PATH"))
    return found is not None and os.path.abspath(found) == os.path.abspath(path)


def _ends_with(words: Sequence[str], tail: Sequence[str]) -> bool:
    return len(words) > len(tail) and list(words[len(words) - len(tail) :]) == list(tail)


def _shortened(words: list[str], environ: Mapping[str, str], which: Callable[..., str | None]) -> list[str]:
    """``words`` with the program (the first word), an absolute path, put as its name alone where
    the PATH finds that very path by that name. Not a path in the environment's own ``bin`` under
    ``uv run``: uv put that folder on this process's PATH, not on the user's."""
    if not words or not os.path.isabs(words[0]):
        return words
    program = os.path.abspath(words[0])
    venv = environ.get("VIRTUAL_ENV")
    if environ.get("UV") and venv and os.path.dirname(program) == os.path.abspath(os.path.join(venv, "bin")):
        return words
    name = os.path.basename(program)
    found = which(name, path=environ.get("PATH"))
    if found is None or os.path.abspath(found) != program:
        return words
    return [name, *words[1:]]
