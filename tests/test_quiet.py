"""A run's terminal holds runjob's own lines: the libraries' chatter (MLflow creating its database,
Accelerate saving state, its note about tied weights) goes to OUTPUT_DIR/runjob.log, while a warning
nobody has judged harmless is still printed."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
from helpers import TINY_GPT

from runjob.record import logfile
from runjob.record.logfile import LibraryLog

# A GPT with tied input and output embeddings: saving it makes Accelerate note the shared tensor.
TIED_GPT = (
    TINY_GPT.format(name="quiet")
    + """
    [train]
    epochs = 2
    batch_size = 8
    log_every = 2
    checkpoint_every = 4
"""
)

OWN_LINE = re.compile(r"runjob: |epoch \d+/\d+  step \d+  |step \d+/\d+  |test  step \d+  ")
PROGRESS_BAR = re.compile(r"epoch \d+/\d+: ")
# A two-process run prints no torchrun banner (OMP_NUM_THREADS): asserted on the two-process
# language model of test_multiprocess.py, which starts as from a user's shell.


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_first_run_on_a_new_store_prints_only_runjobs_own_lines(runjob_tester):
    corpus = runjob_tester.path / "corpus"
    corpus.mkdir()
    for i in range(10):
        (corpus / f"{i}.txt").write_bytes((f"file {i}: the quick brown fox jumps. " * 5).encode()[:130])
    runjob_tester.write_job("job.toml", TIED_GPT)
    (runjob_tester.path / "store").mkdir()
    fresh = {"MLFLOW_TRACKING_URI": f"sqlite:///{runjob_tester.path / 'store' / 'mlflow.db'}"}
    result = runjob_tester.cli_subprocess("job.toml", "--output-dir", "out", env=fresh, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    stdout = [line for line in result.stdout.splitlines() if line.strip()]
    stderr = [line for line in re.split(r"[\r\n]", result.stderr) if line.strip()]
    assert [line for line in stdout if not OWN_LINE.match(line)] == [], "stdout: runjob's lines only"
    assert [line for line in stderr if not (OWN_LINE.match(line) or PROGRESS_BAR.match(line))] == [], (
        "stderr: the progress bar and runjob's lines only"
    )
    assert any(line.startswith("runjob: finished quiet") for line in stdout)
    kept = (runjob_tester.path / "out" / logfile.LOG_FILE).read_text(encoding="utf-8")
    assert "recording INFO mlflow.store.db.utils: Creating initial MLflow database tables" in kept, (
        "the new database's creation, from the recording process, is in the log file"
    )
    assert "train INFO accelerate" in kept and "Saving current state to" in kept, "Accelerate's notes are kept"
    assert "Removed shared tensor" in kept, "the tied-weights note is kept in the file, not printed"


def test_library_info_and_known_harmless_warnings_go_to_the_file_only(tmp_path, capsys):
    with LibraryLog("train") as log:
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        log.open_in(tmp_path)  # what came before the folder was known is written first
        logging.getLogger("accelerate.utils.other").warning(
            "[RANK 0] Removed shared tensor {'head.weight'} while saving"
        )
        logging.getLogger("urllib3.connectionpool").debug("Starting new HTTP connection")  # below the level kept
    assert capsys.readouterr().err == ""
    lines = (tmp_path / "runjob.log").read_text(encoding="utf-8").splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "train INFO mlflow.store.db.utils: Creating initial MLflow database tables...",
        "train WARNING accelerate.utils.other: [RANK 0] Removed shared tensor {'head.weight'} while saving",
    ]


def test_other_warnings_are_printed_and_kept(tmp_path, capsys):
    with warnings.catch_warnings(record=True) as shown, LibraryLog("train") as log:
        warnings.simplefilter("always")
        log.open_in(tmp_path)
        logging.getLogger("mlflow.utils.rest_utils").warning("the server answered 503")
        warnings.warn("something a plugin should know", UserWarning, stacklevel=1)
    assert capsys.readouterr().err == "WARNING mlflow.utils.rest_utils: the server answered 503\n"
    assert [str(w.message) for w in shown] == ["something a plugin should know"], "an unknown warning is shown"
    kept = (tmp_path / "runjob.log").read_text(encoding="utf-8")
    assert "train WARNING mlflow.utils.rest_utils: the server answered 503" in kept
    assert "UserWarning: something a plugin should know" in kept


def test_a_known_harmless_python_warning_goes_to_the_file_only(tmp_path, monkeypatch):
    monkeypatch.setattr(logfile, "HARMLESS_WARNINGS", [(FutureWarning, re.compile("a known note"))])
    with warnings.catch_warnings(record=True) as shown, LibraryLog("train") as log:
        warnings.simplefilter("always")
        log.open_in(tmp_path)
        warnings.warn("a known note", FutureWarning, stacklevel=1)
        warnings.warn("a known note", UserWarning, stacklevel=1)  # another category: not the known one
    assert [(w.category, str(w.message)) for w in shown] == [(UserWarning, "a known note")]
    assert "FutureWarning: a known note" in (tmp_path / "runjob.log").read_text(encoding="utf-8")


def test_the_loggers_and_showwarning_are_put_back(tmp_path):
    mlflow_logger = logging.getLogger("mlflow")
    before = (mlflow_logger.handlers[:], mlflow_logger.level, mlflow_logger.propagate, warnings.showwarning)
    with LibraryLog("train") as log:
        log.open_in(tmp_path)
        assert mlflow_logger.propagate is False and warnings.showwarning is not before[3]
    after = (mlflow_logger.handlers[:], mlflow_logger.level, mlflow_logger.propagate, warnings.showwarning)
    assert after == before
    logfile.open_in(tmp_path / "elsewhere")  # no run: nothing is opened
    assert not (tmp_path / "elsewhere").exists()


def test_commands_besides_a_run_keep_library_chatter_off_the_terminal(runjob_tester):
    """MLflow's INFO lines (a new store's tables) are not printed by any command; a warning is."""
    chatty = """
import logging
import runjob

@runjob.hookimpl
def runjob_register_models(register):
    logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
    logging.getLogger("mlflow.tracking").warning("a warning worth reading")
"""
    runjob_tester.install_plugin("chatty", {"chatty": chatty}, {"chatty": "chatty"})
    result = runjob_tester.cli("plugins")
    assert result.returncode == 0, result.stderr
    assert "Creating initial MLflow database tables" not in result.stdout + result.stderr
    assert "WARNING mlflow.tracking: a warning worth reading" in result.stderr
