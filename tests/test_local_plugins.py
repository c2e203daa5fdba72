"""Plugins without packaging: ``-p PLUGIN`` (a module importable from the working directory, or a
``path/to/file.py``), ``$RUNJOB_PLUGINS`` and ``runjob.run(plugins=[...])``. They load after the
installed plugins under the same rules, in every process a run starts, and the run records them so
that ``rerun`` loads them again; one that cannot be imported is one line, exit 2, before anything runs."""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import SMALL_DIGITS, documented_python

import runjob
from runjob.commands.cli import _with_default_command
from runjob.errors import RunjobError
from runjob.host import plugin_host
from runjob.host.plugin_host import load_plugins, local_plugins, using_local_plugins
from runjob.tags import LOCAL_PLUGINS_TAG as LOCAL_TAG
from runjob.train.entry import resume_command, run_arguments

pytestmark = pytest.mark.timeout(600)

PLAIN_TASK = """
    import runjob


    class PlainOptions(runjob.TaskOptions):
        def metrics(self):
            return {"accuracy": "max"}


    class Plain(runjob.Task):
        def loss(self, outputs, batch):
            # imported here, as a plugin may: a process that only reads the job (validate, the recording
            # process building the MLflow model) then needs no torch
            import torch.nn.functional as F

            return F.cross_entropy(outputs, self.targets(batch))

        def evaluate(self, outputs, batch):
            return {"right": (outputs.argmax(1) == self.targets(batch)).float()}

        def summarize(self, totals, count):
            return {"accuracy": totals["right"] / count}


    @runjob.hookimpl
    def runjob_register_tasks(register):
        register("plain", lambda options, data: Plain(), options=PlainOptions)
"""
"""A local task: cross entropy, scored by accuracy (fits the kit's tiny_cnn on the digits)."""

REPORT = """
    import os
    from pathlib import Path

    import runjob


    class Report(runjob.Callback):
        def on_run_start(self, run):  # every process of the run: one file each
            Path(os.environ["REPORT_DIR"], f"reported-{os.environ.get('RANK', '0')}").write_text("{mark}")


    @runjob.hookimpl
    def runjob_register_callbacks(register):
        register("report", lambda options: Report())
"""
"""A local callback that leaves a file per process (in ``$REPORT_DIR``) saying which version of it ran."""

TINY = (
    SMALL_DIGITS
    + """
    max_steps = 2
    [tracking]
    log_model = "none"
"""
)


def job(name: str, *, task: str = "classification", extra: str = "") -> str:
    return TINY.format(name=name) + f'    [task]\n    name = "{task}"\n' + textwrap.dedent(extra)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    return path


@pytest.fixture
def local(tester, monkeypatch):
    """``tester`` with ``$REPORT_DIR``; afterwards, what importing local plugins leaves in this
    process (``sys.path`` entries, the test's modules, the import cache) is put back."""
    monkeypatch.setenv("REPORT_DIR", str(tester.path))
    path, loaded = list(sys.path), dict(plugin_host._LOADED)
    yield tester
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tester.path)):
            del sys.modules[name]
    plugin_host._LOADED.clear()
    plugin_host._LOADED.update(loaded)


# --- finding and importing --------------------------------------------------------------------


def test_a_module_importable_from_the_working_directory(local):
    """``-p my_plugin`` imports ``my_plugin.py`` from the working directory, which a console
    script does not have on ``sys.path``; without ``-p`` the job's task is unknown."""
    plugin = write(local.path / "my_plugin.py", PLAIN_TASK)
    local.write_job("job.toml", job("module", task="plain"))
    assert str(local.path) not in sys.path
    unknown = local.cli("validate", "job.toml")
    assert unknown.returncode == 2 and "unknown task 'plain'" in unknown.stderr
    assert local.cli("validate", "job.toml", "-p", "my_plugin").returncode == 0
    listed = local.cli("plugins", "-p", "my_plugin")
    assert f"my_plugin  (local {plugin}, -p my_plugin)\n    tasks: plain\n" in listed.stdout
    # before the command too, and before a job file given without one
    assert local.cli("-p", "my_plugin", "validate", "job.toml").returncode == 0
    assert _with_default_command(["-p", "a.py", "-pb", "--plugin=c", "job.toml"]) == [
        *("-p", "a.py", "-pb", "--plugin=c"),
        *("run", "job.toml"),
    ]


def test_a_file_by_path_is_loaded_under_a_module_name_of_its_own(local):
    """``-p tools/extra.py``: loaded from its path, its folder importable for what it imports beside
    it, under a private module name (no module ``extra`` shadows anything); ``$RUNJOB_PLUGINS``
    does the same from the environment, with absolute paths for other processes."""
    write(local.path / "tools" / "plain_task.py", PLAIN_TASK)
    extra = write(local.path / "tools" / "extra.py", "from plain_task import runjob_register_tasks  # noqa\n")
    local.write_job("job.toml", job("file", task="plain"))
    assert local.cli("validate", "job.toml", "-p", "tools/extra.py").returncode == 0
    assert "extra" not in sys.modules
    listed = local.cli("plugins", "-p", "tools/extra.py")
    assert f"extra  (local {extra}, -p tools/extra.py)" in listed.stdout

    found = local_plugins(environ={"RUNJOB_PLUGINS": "tools/extra.py"})
    assert [(p.name, p.kind, p.spec) for p in found] == [("extra", "file", str(extra))]
    assert found[0].sha256 == hashlib.sha256(extra.read_bytes()).hexdigest()
    with using_local_plugins(found):
        host = load_plugins()
    assert [(info.name, info.distribution) for info in host.plugins if info.local] == [("extra", "local")]
    assert host.components["task"]["plain"].plugin == "extra"


BROKEN = {  # -p value, files laid out, the one line said ({path}: the working directory)
    "no-module": (
        "nosuch",
        {},
        "-p nosuch: no module named 'nosuch' importable from {path}; give a module there (my_plugin) or a "
        "path/to/file.py",
    ),
    "close-name": (
        "my_pluginn",
        {"my_plugin.py": PLAIN_TASK},
        "-p my_pluginn: no module named 'my_pluginn' importable from {path}; did you mean 'my_plugin'?",
    ),
    "no-file": ("gone.py", {}, "-p gone.py: no such file ({path}/gone.py)"),
    "syntax": (
        "bad.py",
        {"bad.py": "import runjob\nx = (\n"},
        "-p bad.py: SyntaxError: '(' was never closed ({path}/bad.py:2)",
    ),
    "raises": (
        "boom.py",
        {"boom.py": "import runjob\n\nraise RuntimeError('no GPU here')\n"},
        "-p boom.py: RuntimeError: no GPU here ({path}/boom.py:3)",
    ),
    "its-import": (
        "needs",
        {"needs.py": "import not_installed_anywhere\n"},
        "-p needs: ModuleNotFoundError: No module named 'not_installed_anywhere' ({path}/needs.py:1)",
    ),
    "not-python": (
        "some/folder",
        {},
        "-p some/folder: neither a module name nor a .py file; give a module importable from {path} (my_plugin) or a "
        "path/to/file.py",
    ),
    "installed-name": (
        "tasks.py",
        {"tasks.py": PLAIN_TASK},
        "-p tasks.py: its plugin name 'tasks' is taken by the installed plugin tasks (runjob-train {version}); rename "
        "the file",
    ),
}


@pytest.mark.parametrize("given, files, said", BROKEN.values(), ids=BROKEN.keys())
def test_a_plugin_that_cannot_be_imported_is_one_line_before_anything_runs(local, given, files, said):
    for name, source in files.items():
        write(local.path / name, source)
    local.write_job("job.toml", job("broken"))
    result = local.cli("run", "job.toml", "-p", given, "--output-dir", "out")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["runjob: " + said.format(path=local.path, version=runjob.__version__)]
    assert result.stdout == "" and not (local.path / "out").exists()


def test_two_local_plugins_of_one_name_and_a_class_for_an_object_are_refused(local):
    write(local.path / "a" / "same.py", PLAIN_TASK)
    write(local.path / "b" / "same.py", PLAIN_TASK)
    local.write_job("job.toml", job("twice"))
    result = local.cli("validate", "job.toml", "-p", "a/same.py", "-p", "b/same.py")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "runjob: -p a/same.py and -p b/same.py: two local plugins named 'same'; rename one of them"
    ]

    class Hooks:
        pass

    with pytest.raises(
        RunjobError, match=r"plugins=\[<class .*Hooks'>\]: a class; give an instance of it \(Hooks\(\)\)"
    ):
        local_plugins([Hooks], label="plugins=")


# --- the rules of installed plugins -------------------------------------------------------------

TYPO = """
    import runjob

    @runjob.hookimpl
    def runjob_register_task(register):
        register("plain", lambda options, data: None)
"""

RAISING = """
    import runjob

    @runjob.hookimpl
    def runjob_register_tasks(register):
        raise ValueError("the registration broke")
"""


def test_a_misspelt_hook_or_a_raising_registration_is_a_failure_named_by_the_plugin(local):
    typo = write(local.path / "typo.py", TYPO)
    raising = write(local.path / "raising.py", RAISING)
    local.write_job("job.toml", job("failing", task="plain"))
    result = local.cli("validate", "job.toml", "-p", "typo.py", "-p", "raising.py")
    assert result.returncode == 2
    hint = "unknown hook 'runjob_register_task'; did you mean 'runjob_register_tasks'?"
    assert f"runjob: warning: local plugin typo ({typo}): {hint}" in result.stderr_lines
    assert (
        f"runjob: warning: local plugin raising ({raising}): ValueError: the registration broke" in result.stderr_lines
    )
    assert (
        f"Plugins that failed to load, which may have provided it: typo ({hint}); raising (ValueError" in result.stderr
    )
    listed = local.cli("plugins", "-p", "typo.py")
    assert f"FAILED: typo  (local {typo}): {hint}" in listed.stdout


SHADOW = """
    import runjob
    from runjob_builtins import tasks as builtin

    @runjob.hookimpl
    def runjob_register_tasks(register):
        builtin.runjob_register_tasks(register)  # classification, regression, ...: the built-ins' names
"""


def test_a_built_in_name_stays_the_built_ins_and_plugin_name_picks_the_local_one(local):
    shadow = write(local.path / "shadow.py", SHADOW)
    write(local.path / "plain_a.py", PLAIN_TASK)
    write(local.path / "plain_b.py", PLAIN_TASK)
    local.write_job("bare.toml", job("bare", task="classification"))
    bare = local.cli("validate", "bare.toml", "-p", "shadow.py")
    assert bare.returncode == 0, bare.stderr
    assert (
        f"runjob: warning: plugin shadow (local {shadow}) also registers task 'classification'; jobs get the built-in; "
        'write "shadow:classification" for the plugin\'s'
    ) in bare.stderr_lines
    with using_local_plugins(local_plugins(["shadow.py"])), pytest.warns(plugin_host.PluginWarning):
        host = load_plugins()
    assert host.lookup("task", "classification").plugin == "tasks"
    assert host.lookup("task", "shadow:classification").plugin == "shadow"
    local.write_job("picked.toml", job("picked", task="shadow:classification"))
    assert local.cli("validate", "picked.toml", "-p", "shadow.py").returncode == 0

    local.write_job("plain.toml", job("plain", task="plain"))
    both = local.cli("validate", "plain.toml", "-p", "plain_a.py", "-p", "plain_b.py")
    assert both.returncode == 2
    assert (
        f"task 'plain' is registered by more than one plugin: plugin plain_a (local {local.path}/plain_a.py) and "
        f'plugin plain_b (local {local.path}/plain_b.py); write "plain_a:plain" or "plain_b:plain" to choose'
    ) in both.stderr


def test_a_job_file_cannot_name_a_module(local):
    """A job names components, never code: a module beside it is not imported for ``PLUGIN:NAME``."""
    write(
        local.path / "my_plugin.py",
        "from pathlib import Path\nPath('imported').touch()\n" + textwrap.dedent(PLAIN_TASK),
    )
    local.write_job("job.toml", job("named", task="my_plugin:plain"))
    result = local.cli("validate", "job.toml")
    assert result.returncode == 2
    assert "my_plugin:plain: no plugin is named 'my_plugin'" in result.stderr
    assert not (local.path / "imported").exists() and "my_plugin" not in sys.modules


# --- other processes and the record -------------------------------------------------------------


def test_workers_sweep_trials_and_resume_commands_carry_the_plugins(local, monkeypatch):
    """What a command starts (launched workers, sweep trials: run_arguments; the resume command)
    names each local plugin as ``-p`` that loads it from any folder."""
    write(local.path / "my_plugin.py", PLAIN_TASK)
    report = write(local.path / "report.py", REPORT.replace("{mark}", "1"))
    found = local_plugins(["my_plugin", "report.py"])
    expected = ["-p", f"my_plugin@{local.path}", "-p", str(report)]
    assert run_arguments(Path("job.toml"), plugins=found)[2:] == expected
    with using_local_plugins(found):  # as a command that was given them has them: in the environment
        assert run_arguments(Path("job.toml"))[2:] == expected
        assert resume_command("job.toml", [], Path("out")).endswith(" ".join(expected))
        monkeypatch.chdir(local.path.parent)  # another folder: they still load
        assert [p.path for p in local_plugins()] == [str(local.path / "my_plugin.py"), str(report)]


def test_rerun_finds_a_module_where_the_run_had_it_and_refuses_an_object(local, monkeypatch):
    """A module plugin is imported again by its name from the folder the run imported it from (here
    from another working directory), checked against the file the run had; an object of the run's
    own process cannot be loaded again: one line saying to use a file."""
    from runjob.commands.rerun import rerun_plugins

    plugin = write(local.path / "my_plugin.py", PLAIN_TASK)
    text = json.dumps([p.record() for p in local_plugins(["my_plugin"])])
    sys.modules.pop("my_plugin")
    plugin_host._LOADED.clear()
    monkeypatch.chdir(local.path.parent)
    [again] = rerun_plugins("RUN", text)
    assert (again.name, again.kind, again.path, again.directory) == (
        "my_plugin",
        "module",
        str(plugin),
        str(local.path),
    )
    with pytest.raises(RunjobError, match=r"^run RUN was trained with <Mine object>, an object of its own process, "):
        rerun_plugins("RUN", json.dumps([{"given": "<Mine object>", "name": "Mine", "kind": "object"}]))


def readme_python(first_line: str) -> str:
    return documented_python(first_line)[1]


def test_the_readmes_notebook_runs_a_callback_object_recording_in_a_thread(local, capsys):
    """The README's notebook cell, as written, on a small ``jobs/digits.toml``: the object's
    callback runs, the run records in a thread (no other process could load it) and says so in
    its tag; a job of several processes with an object is refused, saying to use a file."""
    local.write_job("jobs/digits.toml", job("notebook"))
    code = readme_python("# a notebook cell: a callback for this run only\n")
    namespace: dict = {"__name__": "notebook"}
    exec(compile(code, str(documented_python("# a notebook cell")[0]), "exec"), namespace)
    outcome = namespace["outcome"]
    assert outcome.exit_code == 0
    printed = capsys.readouterr().out
    assert "epoch 0: val/accuracy " in printed
    recorded = local.record(outcome.output_dir)
    assert json.loads(recorded.tags[LOCAL_TAG]) == [{"given": "<Mine object>", "name": "Mine", "kind": "object"}]
    assert recorded.tags["runjob.plugin.Mine"] == "local in-process object"

    with pytest.raises(RunjobError, match=r"cannot reach the job's other processes .*; put it in a file"):
        runjob.run("jobs/digits.toml", ["launch.num_processes=2"], plugins=[namespace["Mine"]()])
    with pytest.raises(RunjobError, match=r"recording='process' cannot load an object of this process"):
        runjob.run("jobs/digits.toml", plugins=[namespace["Mine"]()], recording="process")


def test_the_run_records_its_plugins_and_rerun_loads_them_again(local):
    """The tag and job_sources.json name the local plugin; ``rerun`` loads it again from its path,
    refuses it changed or gone (one line, ``-p`` to give another); evaluate asks for the ``-p``."""
    report = write(local.path / "report.py", REPORT.replace("{mark}", "first"))
    local.write_job("job.toml", job("recorded", extra="[callbacks.report]\n"))
    first = local.cli("run", "job.toml", "-p", "report.py", "--output-dir", "first")
    assert first.returncode == 0, first.stderr
    recorded = local.record("first")
    digest = hashlib.sha256(report.read_bytes()).hexdigest()
    expected = {"given": "report.py", "name": "report", "kind": "file", "path": str(report), "sha256": digest}
    assert json.loads(recorded.tags[LOCAL_TAG]) == [expected]
    assert recorded.mlflow is not None and recorded.mlflow.tags[LOCAL_TAG] == recorded.tags[LOCAL_TAG]
    sources = json.loads((local.path / "first" / "record" / "job_sources.json").read_text())
    assert sources["callbacks.report.enabled"]["plugin"] == f"report (local {report})"
    assert "plugin" not in sources["task.name"]
    run_id = recorded.run_id
    (local.path / "reported-0").unlink()

    evaluate = local.cli("evaluate", "first", "--no-record")
    assert evaluate.returncode == 2
    assert evaluate.stderr.splitlines() == [
        f"runjob: run {run_id} was trained with local plugins report ({report}), which this command was not given: "
        f"add -p {report} to `runjob evaluate`"
    ]
    assert local.cli("evaluate", "first", "--no-record", "-p", "report.py").returncode == 0

    again = local.cli("rerun", run_id, "--output-dir", "second")
    assert again.returncode == 0, again.stderr
    assert (local.path / "reported-0").read_text() == "first"
    assert json.loads(local.record("second").tags[LOCAL_TAG])[0]["path"] == str(report)

    write(report, REPORT.replace("{mark}", "changed"))
    changed = local.cli("rerun", run_id, "--output-dir", "third")
    assert changed.returncode == 2 and not (local.path / "third").exists()
    now = hashlib.sha256(report.read_bytes()).hexdigest()
    assert changed.stderr.splitlines() == [
        f"runjob: run {run_id}'s local plugin report ({report}) has changed since the run (sha256 {digest[:12]} then, "
        f"{now[:12]} now); give -p {report} to use it as it is now, or -p PATH for another"
    ]
    other = write(local.path / "elsewhere" / "report.py", REPORT.replace("{mark}", "other"))
    given = local.cli("rerun", run_id, "--output-dir", "third", "-p", "elsewhere/report.py")
    assert given.returncode == 0, given.stderr
    assert (local.path / "reported-0").read_text() == "other"
    assert json.loads(local.record("third").tags[LOCAL_TAG])[0]["path"] == str(other)

    report.unlink()
    gone = local.cli("rerun", run_id, "--output-dir", "fourth")
    assert gone.returncode == 2
    assert gone.stderr.splitlines() == [
        f"runjob: run {run_id}'s local plugin report ({report}) is gone; give it with -p PATH (a file or a module "
        "importable here)"
    ]


@pytest.mark.e2e
def test_two_processes_and_the_recording_process_load_a_local_task(local):
    """A job of two processes (torchrun workers) with a local task and callback from ``-p``: both
    workers run the callback, and the recording process, a fresh interpreter, builds the run's
    MLflow model, which needs the task to read the job."""
    write(
        local.path / "plugins" / "mine.py",
        textwrap.dedent(PLAIN_TASK) + textwrap.dedent(REPORT.replace("{mark}", "mine")),
    )
    local.write_job(
        "job.toml",
        TINY.format(name="two").replace('log_model = "none"', 'log_model = "weights"')
        + '    [task]\n    name = "plain"\n    [callbacks.report]\n',
    )
    result = local.cli_subprocess(
        "run", "job.toml", "-p", "plugins/mine.py", "--num-processes", "2", "--output-dir", "out", timeout=400
    )
    # about 1 run in 4 of a 2-process gloo job aborts at interpreter exit after its work (shared/TRAPS.md)
    assert result.returncode == 0 or "SIGABRT" in result.stderr, result.stderr[-3000:]
    assert "2 process(es) on cpu" in result.stdout
    assert [(local.path / f"reported-{rank}").read_text() for rank in (0, 1)] == ["mine", "mine"]
    assert (local.path / "out" / "mlflow_model" / "MLmodel").is_file(), result.stderr[-3000:]
    run = local.only_run("two")
    assert run.models() == {"two"}
    assert json.loads(run.tags[LOCAL_TAG])[0]["given"] == "plugins/mine.py"


@pytest.mark.e2e
def test_sweep_trials_load_the_plugins_of_the_sweep_command(local):
    """Each trial of ``runjob sweep -p ...`` (a process of its own) trains with the local callback."""
    write(
        local.path / "count.py",
        """
        import os
        from pathlib import Path

        import runjob


        class Count(runjob.Callback):
            def on_run_start(self, run):
                with Path(os.environ["REPORT_DIR"], "trials").open("a") as file:
                    file.write(f"{run.output_dir.name}\\n")


        @runjob.hookimpl
        def runjob_register_callbacks(register):
            register("count", lambda options: Count())
        """,
    )
    local.write_job(
        "job.toml",
        job("swept", extra='[callbacks.count]\n[sweep]\n[sweep.parameters]\n"optimizer.lr" = [0.01, 0.005]\n'),
    )
    result = local.cli("sweep", "job.toml", "-p", "count.py", "--output-dir", "sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted((local.path / "trials").read_text().split()) == ["trial-000", "trial-001"]
