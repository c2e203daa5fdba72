"""containers/: the image, the Compose file, the Slurm scripts and the Kubernetes manifests.

No Docker engine, Slurm or cluster is needed: each file is parsed and checked for what can be
checked here, and the sbatch scripts are run for real against a fake ``scontrol``, ``srun`` and ``runjob``.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONTAINERS = REPO / "containers"
DOCKERFILE = CONTAINERS / "Dockerfile"
DOCKERIGNORE = CONTAINERS / "Dockerfile.dockerignore"
COMPOSE = CONTAINERS / "compose.yaml"
SBATCH = CONTAINERS / "slurm" / "train.sbatch"
PYTORCHJOB = CONTAINERS / "k8s" / "pytorchjob.yaml"

BUILD_LINE = "docker build -f containers/Dockerfile -t runjob ."
RUN_LINE = (
    "docker run --gpus all --shm-size=8g -v $PWD/data:/workspace/data -v $PWD/runs:/workspace/runs "
    "runjob jobs/resnet_cifar.toml"
)


# ---------------------------------------------------------------------------------------------
# Dockerfile parsing


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped and continuation lines joined, as Docker does."""
    logical: list[str] = []
    current = ""
    for raw in path.read_text().splitlines():
        if raw.strip().startswith("#") or (not raw.strip() and not current):
            continue
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current.strip():
        logical.append(current)
    result = []
    for line in logical:
        instruction, _, arguments = line.strip().partition(" ")
        result.append((instruction.upper(), arguments.strip()))
    return result


def arg_defaults(instructions) -> dict[str, str]:
    defaults = {}
    for instruction, arguments in instructions:
        if instruction == "ARG" and "=" in arguments:
            name, _, value = arguments.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def substitute(text: str, variables: dict[str, str]) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"${name} has no default in the Dockerfile"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, text)


def copy_instructions(instructions) -> list[tuple[list[str], str, str]]:
    """(sources, destination, WORKDIR at that point) of each COPY from the build context."""
    copies, workdir = [], "/"
    for instruction, arguments in instructions:
        if instruction == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / arguments)
        elif instruction in ("COPY", "ADD"):
            words = shlex.split(arguments)
            assert not any(w.startswith("--from") for w in words), "copy from the build context only"
            paths = [w for w in words if not w.startswith("--")]
            copies.append((paths[:-1], paths[-1], workdir))
    return copies


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a RUN line (split at ; && || | &, quotes respected)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in (";", "&&", "||", "|", "&"):
            if current:
                commands.append(current)
            current = []
        else:
            current.append(token)
    if current:
        commands.append(current)
    return commands


PIP_OPTIONS_WITH_VALUE = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-t",
    "--target",
}


def pip_installs(instructions) -> list[tuple[int, list[str], list[str]]]:
    """(instruction index, targets, options) of every ``pip install`` in a RUN."""
    installs = []
    for index, (instruction, arguments) in enumerate(instructions):
        if instruction != "RUN":
            continue
        for words in shell_commands(arguments):
            if "pip" not in words or "install" not in words[words.index("pip") :]:
                continue
            rest = words[words.index("install", words.index("pip")) + 1 :]
            targets, options, skip = [], [], False
            for word in rest:
                if skip:
                    skip = False
                elif word.startswith("-"):
                    options.append(word)
                    skip = word in PIP_OPTIONS_WITH_VALUE
                else:
                    targets.append(word)
            installs.append((index, targets, options))
    return installs


def extras(target: str) -> set[str]:
    """The extras of a pip target such as ``.[digits,sweep]``."""
    match = re.fullmatch(r"\.\[([\w,\s-]*)\]", target)
    return {extra.strip() for extra in match.group(1).split(",")} if match else set()


def dockerignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern:
    pattern = pattern.strip("/").removeprefix("./")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def is_ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a parent folder matches too."""
    parts = PurePosixPath(relative).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern[1:] if negated else pattern)
        if any(regex.match(candidate) for candidate in candidates):
            ignored = not negated
    return ignored


# ---------------------------------------------------------------------------------------------
# The image


def test_dockerfile_starts_from_a_pytorch_cuda_runtime_image_with_torch_2_6_or_newer():
    instructions = dockerfile_instructions()
    (base,) = [substitute(a, arg_defaults(instructions)) for i, a in instructions if i == "FROM"]
    match = re.fullmatch(r"pytorch/pytorch:(\d+)\.(\d+)\.(\d+)-cuda(\d+\.\d+)-cudnn(\d+)-runtime", base)
    assert match, f"not an official PyTorch CUDA runtime image: {base}"
    assert (int(match.group(1)), int(match.group(2))) >= (2, 6), base


def test_dockerfile_installs_this_project_after_copying_its_sources():
    instructions = dockerfile_instructions()
    copies = copy_instructions(instructions)
    copied = {PurePosixPath(source).as_posix().rstrip("/") for sources, _, _ in copies for source in sources}
    assert {"pyproject.toml", "README.md", "core", "plugins/runjob_builtins"} <= copied  # README.md: pyproject's readme
    installs = pip_installs(instructions)
    project = [
        (index, targets, options)
        for index, targets, options in installs
        if any(t == "." or t.startswith(".[") for t in targets)
    ]
    assert project, "no `pip install .`"
    # scikit-learn for jobs/digits.toml, Optuna for `runjob sweep` (containers/slurm/sweep.sbatch, k8s/sweep-job.yaml)
    with_extra = [options for _, targets, options in project if any({"digits", "sweep"} <= extras(t) for t in targets)]
    assert with_extra and "--no-deps" not in with_extra[0] and "--no-cache-dir" in with_extra[0], (
        "dependencies with the digits and sweep extras"
    )
    # The real sources must be in place before the project's last install.
    source_copies = [
        index
        for index, (instruction, arguments) in enumerate(instructions)
        if instruction == "COPY" and re.search(r"\b(core|plugins/runjob_builtins)/?\s", arguments + " ")
    ]
    assert max(source_copies) < max(index for index, _, _ in project)
    # The base image's torch is kept: the dependency install is constrained to it.
    assert any(o in ("-c", "--constraint") for o in with_extra[0])


def test_dockerfile_stands_in_an_empty_package_for_every_package_pyproject_lists():
    """The dependency install builds the project from pyproject.toml and one empty ``__init__.py`` per
    top-level package setuptools finds (``[tool.setuptools.packages.find]``: each folder in ``where``
    holds packages whose folders are their import paths; a new top-level package must be added to the
    Dockerfile's loop too, or the dependency install builds a distribution without it)."""
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    tops = [name for name in find["include"] if "*" not in name]
    folders = {f"{where}/{name}" for where in find["where"] for name in tops if (REPO / where / name).is_dir()}
    assert len(folders) == len(tops), (folders, tops)  # each top-level package in exactly one source root
    scripts = [arguments for instruction, arguments in dockerfile_instructions() if instruction == "RUN"]
    loops = [match.group(1).split() for script in scripts for match in re.finditer(r"for package in ([^;]+);", script)]
    assert len(loops) == 1, loops
    assert set(loops[0]) == folders


def test_dockerfile_runs_runjob_as_a_user_that_is_not_root_in_a_folder_with_the_jobs():
    instructions = dockerfile_instructions()
    defaults = arg_defaults(instructions)
    users = [substitute(arguments, defaults) for instruction, arguments in instructions if instruction == "USER"]
    assert users, "no USER: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and user.strip()
    entrypoints = [arguments for instruction, arguments in instructions if instruction == "ENTRYPOINT"]
    assert entrypoints and yaml.safe_load(entrypoints[-1]) == ["runjob"]  # exec form (a JSON list)
    workdir = "/"
    for instruction, arguments in instructions:
        if instruction == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / arguments)
    jobs_targets = [
        str(PurePosixPath(wd) / dest)
        for sources, dest, wd in copy_instructions(instructions)
        if [s.rstrip("/") for s in sources] == ["jobs"]
    ]
    assert jobs_targets and PurePosixPath(jobs_targets[-1]) == PurePosixPath(workdir) / "jobs", (jobs_targets, workdir)
    env = " ".join(arguments for instruction, arguments in instructions if instruction == "ENV")
    assert re.search(r"\bHF_HOME=" + re.escape(workdir), env)
    tracking = re.search(r"\bMLFLOW_TRACKING_URI=(\S+)", env)
    if tracking:  # a sqlite store must live in a folder the run line mounts
        assert tracking.group(1).startswith(f"sqlite:///{workdir}/runs/"), tracking.group(1)


def test_dockerfile_copies_only_paths_that_exist_and_that_the_dockerignore_keeps():
    patterns = dockerignore_patterns()
    for sources, _, _ in copy_instructions(dockerfile_instructions()):
        for source in sources:
            path = REPO / source
            assert path.exists(), f"COPY {source}: not in the repository"
            files = (
                [path]
                if path.is_file()
                else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
            )
            assert files, f"COPY {source}: empty"
            for file in files:
                relative = file.relative_to(REPO).as_posix()
                assert not is_ignored(relative, patterns), f"{relative} is copied but excluded by {DOCKERIGNORE.name}"
    for local_state in (
        ".venv/bin/python",
        ".git/HEAD",
        "data/cifar10/x",
        "runs/job/x",
        "mlflow.db",
        "core/__pycache__/cli.cpython-311.pyc",
    ):
        assert is_ignored(local_state, patterns), f"{local_state} would be sent to the builder"


def test_dockerignore_matcher_follows_docker_rules():
    assert is_ignored("data/x.png", ["data"]) and not is_ignored("core/data_loading.py", ["data"])
    assert is_ignored("core/__pycache__/a.pyc", ["**/__pycache__"])
    assert not is_ignored("core/cli.py", ["core", "!core/cli.py"])


def test_the_copied_files_build_the_project(tmp_path):
    """What the Dockerfile copies is enough for pip to build runjob with its plugins and command."""
    context = tmp_path / "context"
    patterns = dockerignore_patterns()
    for sources, _, _ in copy_instructions(dockerfile_instructions()):
        for source in sources:
            path = REPO / source
            for file in [path] if path.is_file() else path.rglob("*"):
                relative = file.relative_to(REPO).as_posix()
                if file.is_file() and not is_ignored(relative, patterns):
                    (context / relative).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(file, context / relative)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "runjob/commands/cli.py" in names and "runjob_builtins/torchvision_models.py" in names
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    assert "runjob = runjob.commands.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_build_and_run_lines_are_documented_and_match_the_image():
    for document in (DOCKERFILE, CONTAINERS / "README.md"):
        text = document.read_text()
        assert BUILD_LINE in text and RUN_LINE in text, document
    instructions = dockerfile_instructions()
    workdir = [a for i, a in instructions if i == "WORKDIR"][-1]
    mounts = dict(reversed(m.split(":", 1)) for m in re.findall(r"-v (\S+)", RUN_LINE))
    assert {f"{workdir}/data", f"{workdir}/runs"} <= set(mounts)
    assert (REPO / RUN_LINE.split()[-1]).is_file()


# ---------------------------------------------------------------------------------------------
# compose.yaml


def command_options(command) -> dict[str, str]:
    """``--name value`` and ``--name=value`` options of a command given as a list or a string."""
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    options = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            if not equals and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value = words[i + 1]
            options[name] = value
    return options


def mount_targets(service: dict) -> dict[str, str]:
    targets = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        targets[target] = source
    return targets


def inside(path: str, folders) -> bool:
    return any(PurePosixPath(path).is_relative_to(folder) for folder in folders)


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_trainer_reaches_the_mlflow_service_on_the_port_it_listens_on(compose):
    services = compose["services"]
    assert {"mlflow", "trainer"} <= set(services)
    environment = services["trainer"]["environment"]
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    uri = urlparse(environment["MLFLOW_TRACKING_URI"])
    assert uri.scheme == "http" and uri.hostname in services, uri
    options = command_options(services["mlflow"]["command"])
    assert options["--host"] == "0.0.0.0", "listening on localhost only, other containers cannot connect"
    assert uri.port == int(options["--port"])
    # MLflow 3 answers 403 to Host headers that are not localhost or a private IP unless allowed.
    allowed = options.get("--allowed-hosts", "").split(",")
    host_header = f"{uri.hostname}:{uri.port}"
    assert "*" in allowed or any(fnmatch.fnmatch(host_header, a) if "*" in a else host_header == a for a in allowed), (
        allowed
    )
    healthcheck = " ".join(services["mlflow"]["healthcheck"]["test"])
    assert "/health" in healthcheck and f":{options['--port']}/" in healthcheck
    assert services["trainer"]["depends_on"]["mlflow"]["condition"] == "service_healthy"


def test_compose_mlflow_keeps_a_database_and_artifacts_on_volumes(compose):
    mlflow = compose["services"]["mlflow"]
    assert re.fullmatch(r"ghcr\.io/mlflow/mlflow:v3\.\d+\.\d+", mlflow["image"]), "a pinned MLflow 3 image"
    options = command_options(mlflow["command"])
    mounts = mount_targets(mlflow)
    store = urlparse(options["--backend-store-uri"])
    assert store.scheme.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql"), store
    if store.scheme == "sqlite":  # sqlite:////abs/path; sqlite:///rel/path is relative to the working directory
        database = options["--backend-store-uri"].removeprefix("sqlite:///")
        assert database.startswith("/") and inside(database, mounts), f"{database} is lost with the container"
    artifacts = options.get("--artifacts-destination") or options.get("--default-artifact-root")
    assert artifacts and inside(urlparse(artifacts).path, mounts)
    named = {source for source in mounts.values() if not source.startswith((".", "/"))}
    assert named <= set(compose.get("volumes") or {})


def test_compose_trainer_builds_the_image_and_gets_gpus_shared_memory_and_volumes(compose):
    trainer = compose["services"]["trainer"]
    context = (COMPOSE.parent / trainer["build"]["context"]).resolve()
    assert context == REPO
    assert (context / trainer["build"]["dockerfile"]).resolve() == DOCKERFILE
    (device,) = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert (
        device["driver"] == "nvidia"
        and "gpu" in device["capabilities"]
        and device.get("count", device.get("device_ids"))
    )
    size = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(trainer["shm_size"]).lower())
    assert size and int(size.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[size.group(2)] >= 2**30
    mounts = mount_targets(trainer)
    assert {"/workspace/data", "/workspace/runs"} <= set(mounts)
    named = {source for source in mounts.values() if not source.startswith((".", "/"))}
    assert named <= set(compose.get("volumes") or {})
    assert trainer["command"] == ["jobs/resnet_cifar.toml"] and (REPO / trainer["command"][0]).is_file()


# ---------------------------------------------------------------------------------------------
# slurm/train.sbatch

FAKE_SCONTROL = """#!/bin/sh
if [ "$1 $2" = "show hostnames" ]; then printf 'node1\\nnode2\\n'; exit 0; fi
echo "$*" >> "$FAKE_DIR/scontrol.log"
if [ "$1" = requeue ]; then kill "$(cat "$FAKE_DIR/srun.pid")"; fi
"""
FAKE_SRUN = """#!/bin/sh
echo $$ > "$FAKE_DIR/srun.pid"
for word in "$@"; do printf '%s\\n' "$word"; done
if [ -n "$FAKE_SRUN_SLEEP" ]; then exec sleep "$FAKE_SRUN_SLEEP"; fi
"""


@pytest.fixture
def fake_slurm(tmp_path):
    """Run the sbatch script under bash with Slurm's variables and fake scontrol/srun first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)

    def env(**extra: str) -> dict[str, str]:
        base = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "FAKE_DIR": str(tmp_path),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_NNODES": "2",
            "SLURM_NODEID": "0",
            "SLURM_CPUS_PER_TASK": "48",
            "SLURM_GPUS_ON_NODE": "8",
        }
        base.update(extra)
        return {k: v for k, v in base.items() if v is not None}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(SBATCH), *args], cwd=REPO, env=env(**extra), capture_output=True, text=True, timeout=60
        )

    run.env = env
    run.dir = tmp_path
    return run


def parse_torchrun(words: list[str]):
    from torch.distributed.run import parse_args

    return parse_args(words)


def launch_words(stdout: str) -> tuple[list[str], list[str]]:
    """srun's own arguments and torchrun's, from the fake srun's output (one argument a line)."""
    words = stdout.splitlines()
    assert "torchrun" in words, stdout
    split = words.index("torchrun")
    return words[:split], words[split + 1 :]


def test_sbatch_script_is_valid_bash_with_strict_mode_and_the_slurm_header():
    proc = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    text = SBATCH.read_text()
    assert re.search(r"^set -euo pipefail$", text, re.M)
    header = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    assert header["nodes"] == "2" and header["ntasks-per-node"] == "1" and header["gpus-per-node"] == "8"
    assert int(header["cpus-per-task"]) >= 8 and "requeue" in header


def test_sbatch_renders_one_torchrun_per_node_with_the_slurm_rendezvous(fake_slurm):
    proc = fake_slurm("jobs/digits.toml", "--set", "train.epochs=1")
    assert proc.returncode == 0, proc.stderr
    srun, torchrun = launch_words(proc.stdout)
    assert "--ntasks-per-node=1" in srun and "--nodes=2" in srun and "--cpus-per-task=48" in srun
    args = parse_torchrun(torchrun)
    assert args.nnodes == "2" and args.nproc_per_node == "8"
    host, port = args.rdzv_endpoint.split(":")
    assert host == "node1" and 1024 < int(port) < 32768
    assert args.rdzv_backend == "c10d" and args.rdzv_id == "4242"
    assert args.module and args.training_script == "runjob"
    assert args.training_script_args == [
        "jobs/digits.toml",
        "--output-dir",
        "runs/slurm-4242",
        "--resume",
        "auto",
        "--set",
        "train.epochs=1",
    ], "a requeued job (same id) finds its folder and continues from its checkpoint"


def test_sbatch_defaults_to_the_headline_job_and_honours_port_and_gpu_settings(fake_slurm):
    proc = fake_slurm(MASTER_PORT="29999", SLURM_GPUS_ON_NODE="4")
    assert proc.returncode == 0, proc.stderr
    args = parse_torchrun(launch_words(proc.stdout)[1])
    assert args.rdzv_endpoint == "node1:29999" and args.nproc_per_node == "4"
    assert args.training_script_args[0] == "jobs/resnet_cifar.toml"


def test_sbatch_dry_run_prints_the_same_command_and_starts_nothing(fake_slurm):
    dry = fake_slurm("jobs/digits.toml", RUNJOB_DRY_RUN="1")
    assert dry.returncode == 0, dry.stderr
    assert not (fake_slurm.dir / "srun.pid").exists(), "srun was started"
    real = fake_slurm("jobs/digits.toml")
    assert real.returncode == 0, real.stderr
    words = shlex.split(dry.stdout)
    assert words[0] == "srun" and words[1:] == real.stdout.splitlines()


def test_sbatch_refuses_to_start_outside_slurm_or_without_the_job_file(fake_slurm):
    outside = fake_slurm(SLURM_JOB_ID=None)
    assert outside.returncode != 0 and "SLURM_JOB_ID" in outside.stderr
    missing = fake_slurm("jobs/no_such_job.toml")
    assert missing.returncode == 2 and "no_such_job.toml" in missing.stderr
    assert not (fake_slurm.dir / "srun.pid").exists(), "srun was started"


@pytest.mark.parametrize("requeue", ["1", "0"])
def test_sbatch_time_limit_signal_requeues_only_when_asked(fake_slurm, requeue):
    process = subprocess.Popen(
        ["bash", str(SBATCH)],
        cwd=REPO,
        env=fake_slurm.env(RUNJOB_REQUEUE=requeue, FAKE_SRUN_SLEEP="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_file = fake_slurm.dir / "srun.pid"
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "srun never started"
        time.sleep(0.2)
        process.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends before the time limit
        if requeue == "0":
            time.sleep(0.5)
            assert process.poll() is None, "the script must go on waiting for srun"
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    log = fake_slurm.dir / "scontrol.log"
    if requeue == "1":
        assert log.read_text().split() == ["requeue", "4242"] and process.returncode == 0, stderr
    else:
        assert not log.exists() and process.returncode == 128 + signal.SIGTERM, stderr


# ---------------------------------------------------------------------------------------------
# k8s/pytorchjob.yaml


@pytest.fixture(scope="module")
def pytorchjob():
    return yaml.safe_load(PYTORCHJOB.read_text())


def pytorch_container(replica: dict) -> dict:
    containers = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"]
    assert len(containers) == 1, "the operator configures the container named pytorch"
    return containers[0]


def test_pytorchjob_has_a_master_and_workers_with_the_same_image(pytorchjob):
    assert pytorchjob["apiVersion"] == "kubeflow.org/v1" and pytorchjob["kind"] == "PyTorchJob"
    replicas = pytorchjob["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] >= 1
    images = {pytorch_container(spec)["image"] for spec in replicas.values()}
    assert len(images) == 1
    (image,) = images
    assert image.strip() and image.rsplit("/", 1)[-1].split(":")[0] == BUILD_LINE.split("-t ")[1].split()[0]
    assert image in (CONTAINERS / "README.md").read_text()
    for spec in replicas.values():
        assert spec["restartPolicy"] == "OnFailure"
        uid = spec["template"]["spec"].get("securityContext", {}).get("runAsUser")
        assert uid is None or str(uid) == arg_defaults(dockerfile_instructions())["RUNJOB_UID"]


def test_pytorchjob_pods_get_gpus_shared_memory_and_the_tracking_server(pytorchjob):
    nproc = int(pytorchjob["spec"]["nprocPerNode"])
    for name, spec in pytorchjob["spec"]["pytorchReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        container = pytorch_container(spec)
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == nproc, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert set(mounts.values()) <= set(volumes)
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert urlparse(env["MLFLOW_TRACKING_URI"]).scheme in ("http", "https")


def test_pytorchjob_command_is_torchrun_of_runjob_with_the_operator_environment(pytorchjob):
    spec = pytorchjob["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r["replicas"] for r in replicas.values())
    for rank, (_, replica) in enumerate(sorted(replicas.items())):  # Master is node 0, Worker i is node i + 1
        container = pytorch_container(replica)
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port"]
        operator_env = {
            "PET_NNODES": str(total),
            "PET_NPROC_PER_NODE": spec["nprocPerNode"],
            "PET_NODE_RANK": str(rank),
            "MASTER_ADDR": f"{pytorchjob['metadata']['name']}-master-0",
            "MASTER_PORT": str(port),
        }
        operator_env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
        words = [*container.get("command", []), *container.get("args", [])]
        expanded = [re.sub(r"\$\((\w+)\)", lambda m, env=operator_env: env[m.group(1)], str(w)) for w in words]
        assert expanded[0] == "torchrun", expanded
        args = parse_torchrun(expanded[1:])
        assert int(args.nnodes) == total and args.nproc_per_node == spec["nprocPerNode"]
        assert args.master_addr == operator_env["MASTER_ADDR"] and args.master_port == port and args.node_rank == rank
        assert args.module and args.training_script == "runjob"
        assert (REPO / args.training_script_args[0]).is_file(), args.training_script_args
        # a restarted pod continues in the same folder, on a volume every pod shares and that outlives them
        assert "--resume=auto" in args.training_script_args
        (folder,) = [w for w in words if str(w).startswith("--output-dir=")]
        assert folder == "--output-dir=runs/$(PYTORCHJOB_NAME)"
        (named,) = [e for e in container["env"] if e["name"] == "PYTORCHJOB_NAME"]
        assert named["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['training.kubeflow.org/job-name']"
        volumes = {v["name"]: v for v in replica["template"]["spec"]["volumes"]}
        (runs,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/workspace/runs"]
        assert volumes[runs]["persistentVolumeClaim"]["claimName"] == "runjob-runs"


# ---------------------------------------------------------------------------------------------
# slurm/sweep.sbatch: a job array of `runjob sweep JOB --join SWEEP_DIR` workers

SWEEP_SBATCH = CONTAINERS / "slurm" / "sweep.sbatch"
SWEEP_JOB = CONTAINERS / "k8s" / "sweep-job.yaml"

FAKE_SWEEP_SRUN = """#!/bin/sh
# srun's own options (all --name=value), then the command of its one task, run in srun's place
printf '%s\\n' "$@" > "$FAKE_DIR/srun.args"
while [ $# -gt 0 ]; do
    case "$1" in -*) shift ;; *) break ;; esac
done
exec "$@"
"""
FAKE_RUNJOB = """#!/bin/bash
trap 'echo TERM > "$FAKE_DIR/runjob.term"; kill $! 2>/dev/null; exit 143' TERM
echo $$ > "$FAKE_DIR/runjob.pid"
printf '%s\\n' "$@"
if [ -n "${FAKE_RUNJOB_SLEEP:-}" ]; then
    sleep "$FAKE_RUNJOB_SLEEP" &
    wait $!
fi
"""


@pytest.fixture
def sweep_slurm(tmp_path):
    """Run sweep.sbatch as array task 0 of array job 5000, from a submission folder of its own (the
    sweep folder is created under it), with a fake srun that runs its command and a fake runjob
    that prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SWEEP_SRUN), ("runjob", FAKE_RUNJOB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    work = (tmp_path / "work").resolve()
    work.mkdir()
    shutil.copy(REPO / "jobs" / "digits.toml", work / "sweep.toml")

    def env(**extra: str | None) -> dict[str, str]:
        base = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "FAKE_DIR": str(tmp_path),
            "SLURM_JOB_ID": "5001",  # each array task has a job id of its own
            "SLURM_ARRAY_JOB_ID": "5000",
            "SLURM_ARRAY_TASK_ID": "0",
            "SLURM_CPUS_PER_TASK": "8",
        }
        base.update(extra)
        return {k: v for k, v in base.items() if v is not None}

    def run(*args: str, **extra: str | None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(SWEEP_SBATCH), *args], cwd=work, env=env(**extra), capture_output=True, text=True, timeout=60
        )

    run.env = env
    run.dir = tmp_path
    run.work = work
    return run


def srun_words(fake_dir: Path) -> tuple[list[str], list[str]]:
    """srun's own options and the command of its task, as the fake srun recorded them."""
    words = (fake_dir / "srun.args").read_text().splitlines()
    split = next(i for i, word in enumerate(words) if not word.startswith("-"))
    return words[:split], words[split:]


def test_sweep_sbatch_is_valid_bash_with_strict_mode_and_an_array_of_one_gpu_tasks():
    proc = subprocess.run(["bash", "-n", str(SWEEP_SBATCH)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    text = SWEEP_SBATCH.read_text()
    assert re.search(r"^set -euo pipefail$", text, re.M)
    header = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.M))
    array = re.fullmatch(r"(\d+)-(\d+)%(\d+)", header["array"])
    assert array, f"--array=FIRST-LAST%THROTTLE, got {header['array']}"
    first, last, throttle = map(int, array.groups())
    assert first < last and 1 <= throttle <= last - first + 1
    assert header.get("ntasks", "1") == "1" and header.get("nodes", "1") == "1"
    gpus = header.get("gres") == "gpu:1" or "1" in (header.get("gpus-per-task"), header.get("gpus"))
    assert gpus, "one GPU per array task"
    assert "requeue" in header
    # the header documents the array, the command every task runs, and how to resume
    assert "--array=0-K%P" in text and "--join" in text and "--resume" in text and "SWEEP_DIR=" in text


def test_sweep_sbatch_runs_a_worker_that_joins_the_arrays_sweep_folder(sweep_slurm):
    proc = sweep_slurm("sweep.toml", "--set", "train.epochs=2")
    assert proc.returncode == 0, proc.stderr
    folder = sweep_slurm.work / "runs" / "sweeps" / "5000"
    runjob_args = ["sweep", "sweep.toml", "--join", str(folder), "--set", "train.epochs=2"]
    assert proc.stdout.splitlines() == runjob_args
    options, command = srun_words(sweep_slurm.dir)
    assert command == ["runjob", *runjob_args]
    assert "--ntasks=1" in options and "--cpus-per-task=8" in options
    assert folder.is_dir(), "the sweep folder is made before the workers race to create the sweep in it"


def test_sweep_sbatch_gives_every_task_of_one_array_the_same_folder(sweep_slurm):
    def join(**extra: str) -> str:
        proc = sweep_slurm("sweep.toml", **extra)
        assert proc.returncode == 0, proc.stderr
        words = proc.stdout.splitlines()
        return words[words.index("--join") + 1]

    first = join(SLURM_JOB_ID="5001", SLURM_ARRAY_TASK_ID="0")
    second = join(SLURM_JOB_ID="5002", SLURM_ARRAY_TASK_ID="1")
    assert first == second == str(sweep_slurm.work / "runs" / "sweeps" / "5000")
    other_array = join(SLURM_JOB_ID="6001", SLURM_ARRAY_JOB_ID="6000")
    assert other_array == str(sweep_slurm.work / "runs" / "sweeps" / "6000")
    # SWEEP_DIR: more workers for a running sweep, or a new array that resumes an ended one
    given = sweep_slurm.dir / "shared" / "sweep-5000"
    assert join(SLURM_JOB_ID="6001", SLURM_ARRAY_JOB_ID="6000", SWEEP_DIR=str(given)) == str(given)


def test_sweep_sbatch_dry_run_prints_the_same_command_and_starts_nothing(sweep_slurm):
    dry = sweep_slurm("sweep.toml", "--set", 'sweep.storage="postgresql://u:p@db/optuna"', RUNJOB_DRY_RUN="1")
    assert dry.returncode == 0, dry.stderr
    assert not (sweep_slurm.dir / "srun.args").exists(), "srun was started"
    assert not (sweep_slurm.work / "runs").exists()
    real = sweep_slurm("sweep.toml", "--set", 'sweep.storage="postgresql://u:p@db/optuna"')
    assert real.returncode == 0, real.stderr
    options, command = srun_words(sweep_slurm.dir)
    assert shlex.split(dry.stdout) == ["srun", *options, *command]
    assert command[-1] == 'sweep.storage="postgresql://u:p@db/optuna"', "a --set value reaches runjob unchanged"


def test_sweep_sbatch_command_is_the_one_the_readme_shows(sweep_slurm):
    dry = sweep_slurm("sweep.toml", RUNJOB_DRY_RUN="1")
    assert dry.returncode == 0, dry.stderr
    shown = " ".join(shlex.split(dry.stdout))
    shown = shown.replace(str(sweep_slurm.work), "$PWD").replace("/5000", "/$SLURM_ARRAY_JOB_ID")
    shown = shown.replace(" sweep.toml ", " jobs/digits_sweep.toml ")  # the README names the repository's job
    readme = (CONTAINERS / "README.md").read_text()
    assert shown in readme.splitlines(), shown
    assert "sbatch containers/slurm/sweep.sbatch jobs/digits_sweep.toml" in readme


def test_sweep_sbatch_refuses_in_one_line_outside_slurm_or_without_the_job_file(sweep_slurm):
    outside = sweep_slurm("sweep.toml", SLURM_JOB_ID=None)
    assert outside.returncode == 2 and "SLURM_JOB_ID" in outside.stderr
    missing = sweep_slurm("no_such_job.toml")
    assert missing.returncode == 2 and "no_such_job.toml" in missing.stderr
    no_job = sweep_slurm()
    assert no_job.returncode == 2 and "JOB.toml" in no_job.stderr
    for proc in (outside, missing, no_job):
        assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout, proc.stderr
    assert not (sweep_slurm.dir / "srun.args").exists(), "srun was started"
    assert not (sweep_slurm.work / "runs").exists()


def test_sweep_sbatch_passes_slurms_sigterm_on_to_runjob(sweep_slurm):
    """Preempted or at its time limit, Slurm sends SIGTERM to the batch script; runjob must get it
    to let the running trial write its checkpoint."""
    process = subprocess.Popen(
        ["bash", str(SWEEP_SBATCH), "sweep.toml"],
        cwd=sweep_slurm.work,
        env=sweep_slurm.env(FAKE_RUNJOB_SLEEP="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_file = sweep_slurm.dir / "runjob.pid"
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "runjob never started"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert (sweep_slurm.dir / "runjob.term").exists(), "SIGTERM did not reach runjob"
    assert process.returncode == 128 + signal.SIGTERM, stderr


# ---------------------------------------------------------------------------------------------
# k8s/sweep-job.yaml: an Indexed Job of `runjob sweep JOB --join FOLDER` workers

SAMPLE_STORAGE = "postgresql://optuna:p%40ss@postgres:5432/optuna"


@pytest.fixture(scope="module")
def sweep_manifest() -> dict[str, dict]:
    documents = [d for d in yaml.safe_load_all(SWEEP_JOB.read_text()) if d]
    kinds = [d["kind"] for d in documents]
    assert sorted(kinds) == ["Job", "PersistentVolumeClaim"], kinds
    return {d["kind"]: d for d in documents}


def sweep_container(job: dict) -> dict:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def sweep_overrides(args: list[str]) -> list[str]:
    """The values of the ``--set`` flags after ``sweep JOB --join FOLDER``."""
    rest = args[4:]
    assert rest[::2] == ["--set"] * len(rest[1::2]) and len(rest) % 2 == 0, rest
    return rest[1::2]


def expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], word)


def test_sweep_job_is_an_indexed_job_of_workers_with_the_runjob_image(sweep_manifest):
    job = sweep_manifest["Job"]
    assert job["apiVersion"] == "batch/v1"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["parallelism"] <= spec["completions"]
    pod = spec["template"]["spec"]
    container = sweep_container(job)
    if "podFailurePolicy" in spec:
        assert pod["restartPolicy"] == "Never", "Kubernetes takes a podFailurePolicy only with restartPolicy Never"
        for rule in spec["podFailurePolicy"]["rules"]:
            named = rule.get("onExitCodes", {}).get("containerName")
            assert named in (None, container["name"]), rule
    else:
        assert pod["restartPolicy"] in ("Never", "OnFailure")
    image = container["image"]
    assert image.rsplit("/", 1)[-1].split(":")[0] == BUILD_LINE.split("-t ")[1].split()[0]
    assert "command" not in container, "the image's ENTRYPOINT (runjob) runs the args"
    uid = pod.get("securityContext", {}).get("runAsUser")
    assert uid is None or str(uid) == arg_defaults(dockerfile_instructions())["RUNJOB_UID"]
    assert pod.get("terminationGracePeriodSeconds", 30) >= 30, "time for the trial's checkpoint after SIGTERM"


def test_sweep_job_joins_a_shared_folder_with_the_study_in_postgresql(sweep_manifest):
    job = sweep_manifest["Job"]
    container = sweep_container(job)
    args = [str(word) for word in container["args"]]
    assert args[0] == "sweep" and args[2] == "--join", args
    folder = PurePosixPath(args[3])
    overrides = sweep_overrides(args)
    assert 'sweep.storage="$(OPTUNA_STORAGE)"' in overrides
    (study,) = [o for o in overrides if o.startswith("sweep.study=")]
    assert re.fullmatch(r"[\w.-]+", tomllib.loads(f"v = {study.partition('=')[2]}")["v"]), "a fixed study name"
    # the storage URL: from a Secret, expanded by Kubernetes into a TOML string runjob reads back unchanged
    env = {e["name"]: e for e in container["env"]}
    secret = env["OPTUNA_STORAGE"]["valueFrom"]["secretKeyRef"]
    assert secret["name"] and secret["key"]
    values = {name: e.get("value", SAMPLE_STORAGE) for name, e in env.items()}
    assert set(re.findall(r"\$\((\w+)\)", " ".join(args))) <= set(values), "Kubernetes leaves an unknown $(VAR) as is"
    (storage,) = [expand(o, values) for o in overrides if o.startswith("sweep.storage=")]
    assert tomllib.loads(f"v = {storage.partition('=')[2]}")["v"] == SAMPLE_STORAGE
    # the folder (trial folders, checkpoints) is on a ReadWriteMany claim every pod mounts
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if folder.is_relative_to(m["mountPath"])]
    assert not mount.get("readOnly")
    claim = sweep_manifest["PersistentVolumeClaim"]
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"]


def test_sweep_job_pods_get_one_gpu_shared_memory_and_the_tracking_server(sweep_manifest):
    job = sweep_manifest["Job"]
    container = sweep_container(job)
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == 1
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounts.values()) <= set(volumes)
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e.get("value") for e in container["env"]}
    uri = urlparse(env["MLFLOW_TRACKING_URI"])
    assert uri.scheme in ("http", "https") and uri.hostname


def test_sweep_job_runs_a_job_of_this_repository_that_has_a_sweep_table(sweep_manifest):
    import tomli_w

    from runjob.host.plugin_host import load_plugins
    from runjob.job.validation import load_resolved

    job = sweep_manifest["Job"]
    args = [str(word) for word in sweep_container(job)["args"]]
    assert PurePosixPath(args[1]).parts[0] == "jobs" and (REPO / args[1]).is_file(), "the image has jobs/"
    values = {"OPTUNA_STORAGE": SAMPLE_STORAGE}
    overrides = [expand(o, values) for o in sweep_overrides(args)]
    checked = overrides
    host = load_plugins()
    resolved = load_resolved(REPO / args[1], checked, host)
    assert resolved.sweep is not None, "the job needs a [sweep] table, in its file or made by the --set flags"
    assert resolved.sweep.trials is None or resolved.sweep.trials >= job["spec"]["parallelism"]
    # every swept key is one the job takes, with each value (each bound of a range)
    for key, spec in resolved.sweep.parameters.items():
        for value in spec if isinstance(spec, list) else (spec.low, spec.high):
            toml_value = tomli_w.dumps({"v": value}).partition("=")[2].strip()
            load_resolved(REPO / args[1], [*checked, f"{key}={toml_value}"], host)


def test_sweep_recipes_are_documented(sweep_manifest):
    readme = (CONTAINERS / "README.md").read_text()
    assert "## Sweeps on a cluster" in readme
    for path in ("slurm/sweep.sbatch", "k8s/sweep-job.yaml"):
        assert re.search(rf"^\| `{re.escape(path)}` \|", readme, re.M), f"{path} is missing from the table"
    assert "kubectl apply -f containers/k8s/sweep-job.yaml" in readme
    assert re.search(r"^optuna-dashboard runs/sweeps/\S+/study\.journal", readme, re.M)
    assert re.search(r"^optuna-dashboard postgresql://", readme, re.M)
    assert "psycopg2-binary" in readme and "psycopg2-binary" in SWEEP_JOB.read_text()
    args = [str(word) for word in sweep_container(sweep_manifest["Job"])["args"]]
    for override in sweep_overrides(args):
        assert override in readme, override


# ---------------------------------------------------------------------------------------------
# The object-store variants: k8s/pytorchjob-s3.yaml and slurm/train-s3.sbatch read a streamed
# dataset's shards from s3:// or gs:// (credentials from a Secret / the environment), not a volume

PYTORCHJOB_S3 = CONTAINERS / "k8s" / "pytorchjob-s3.yaml"
SBATCH_S3 = CONTAINERS / "slurm" / "train-s3.sbatch"
STREAMED_JOB = "jobs/digits_streamed.toml"
CREDENTIAL_VARIABLES = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GOOGLE_APPLICATION_CREDENTIALS",
}
K8S_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@pytest.fixture(scope="module")
def pytorchjob_s3():
    return yaml.safe_load(PYTORCHJOB_S3.read_text())


def k8s_bytes(quantity) -> int:
    """A Kubernetes quantity of bytes (``20Gi``, ``8G``, ``500M``)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(quantity))
    assert match, f"not a quantity of bytes: {quantity!r}"
    return int(match.group(1)) * K8S_UNITS[match.group(2) or ""]


def set_values(words: list[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` flags (two words each) as KEY -> VALUE, the last one winning, as runjob applies them."""
    values = {}
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "--set":
            key, _, text = value.partition("=")
            values[key] = text
    return values


def expanded_command(pytorchjob: dict, replica_name: str) -> list[str]:
    """A replica's command and args with Kubernetes' $(VAR) expansion, as the operator's environment
    (see test_pytorchjob_command_is_torchrun_of_runjob_with_the_operator_environment) and the
    container's literal env values make them."""
    spec = pytorchjob["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    rank = sorted(replicas).index(replica_name)
    container = pytorch_container(replicas[replica_name])
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port"]
    env = {
        "PET_NNODES": str(sum(r["replicas"] for r in replicas.values())),
        "PET_NPROC_PER_NODE": spec["nprocPerNode"],
        "PET_NODE_RANK": str(rank),
        "MASTER_ADDR": f"{pytorchjob['metadata']['name']}-master-0",
        "MASTER_PORT": str(port),
        "PYTORCHJOB_NAME": pytorchjob["metadata"]["name"],
    }
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    words = [str(w) for w in (*container.get("command", []), *container.get("args", []))]
    unknown = set(re.findall(r"\$\((\w+)\)", " ".join(words))) - set(env)
    assert not unknown, f"Kubernetes leaves an unknown $(VAR) as is: {unknown}"
    return [expand(word, env) for word in words]


def secret_line(text: str) -> list[str]:
    """The documented ``kubectl create secret generic runjob-s3 ...`` line, split."""
    lines = [line.lstrip("#").strip() for line in text.splitlines()]
    (line,) = [line for line in lines if line.startswith("kubectl create secret generic runjob-s3 ")]
    return shlex.split(line)


@pytest.mark.parametrize(
    "check",
    [
        test_pytorchjob_has_a_master_and_workers_with_the_same_image,
        test_pytorchjob_pods_get_gpus_shared_memory_and_the_tracking_server,
    ],
    ids=["master-and-workers", "gpus-shm-tracking"],
)
def test_pytorchjob_s3_passes_the_checks_of_pytorchjob(pytorchjob_s3, check):
    check(pytorchjob_s3)


def test_pytorchjob_s3_is_pytorchjob_with_another_data_source(pytorchjob, pytorchjob_s3):
    """The same image, processes, launch, user, ports, shared memory and runs' claim as
    k8s/pytorchjob.yaml; only where the data comes from differs."""
    assert pytorchjob_s3["metadata"]["name"] != pytorchjob["metadata"]["name"], "two jobs that can run side by side"
    for key in ("nprocPerNode", "runPolicy"):
        assert pytorchjob_s3["spec"][key] == pytorchjob["spec"][key], key
    for name, replica in pytorchjob_s3["spec"]["pytorchReplicaSpecs"].items():
        original = pytorchjob["spec"]["pytorchReplicaSpecs"][name]
        assert replica["replicas"] == original["replicas"] and replica["restartPolicy"] == original["restartPolicy"]
        pod, original_pod = replica["template"]["spec"], original["template"]["spec"]
        assert pod["securityContext"] == original_pod["securityContext"], name
        container, original_container = pytorch_container(replica), pytorch_container(original)
        for key in ("image", "command", "ports"):
            assert container[key] == original_container[key], (name, key)
        assert container["resources"]["limits"] == original_container["resources"]["limits"], name
        # torchrun's own options, then `-m runjob`
        launch = container["args"][: container["args"].index("runjob") + 1]
        assert launch == original_container["args"][: len(launch)], name
        volumes = {v["name"]: v for v in pod["volumes"]}
        original_volumes = {v["name"]: v for v in original_pod["volumes"]}
        for path in ("/dev/shm", "/workspace/runs"):
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
            (original_mount,) = [m for m in original_container["volumeMounts"] if m["mountPath"] == path]
            assert mount == original_mount and volumes[mount["name"]] == original_volumes[original_mount["name"]], path


def test_pytorchjob_s3_reads_the_shards_from_the_object_store_and_no_data_volume(pytorchjob_s3):
    from runjob.host.streams import parse_location

    for name, replica in pytorchjob_s3["spec"]["pytorchReplicaSpecs"].items():
        pod = replica["template"]["spec"]
        container = pytorch_container(replica)
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["runjob-runs"], f"{name}: the run's folder is the only claim: {claims}"
        assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/workspace/data")], name
        expanded = expanded_command(pytorchjob_s3, name)
        args = parse_torchrun(expanded[1:])
        assert args.module and args.training_script == "runjob"
        job, *rest = args.training_script_args
        assert job == STREAMED_JOB
        # the same folder after a restart, on the claim every pod mounts, as in pytorchjob.yaml
        assert rest[:2] == [f"--output-dir=runs/{pytorchjob_s3['metadata']['name']}", "--resume=auto"]
        (runs,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/workspace/runs"]
        assert not runs.get("readOnly")
        # the location: the container's RUNJOB_DATA, put in place by Kubernetes, read by runjob as a string
        overrides = set_values(rest)
        assert "dataset.download" not in overrides
        (data,) = [e["value"] for e in container["env"] if e["name"] == "RUNJOB_DATA"]
        assert "dataset.location=$(RUNJOB_DATA)" in [str(w) for w in container["args"]]
        assert overrides["dataset.location"] == data
        assert parse_location(data).scheme == "s3", data


def test_pytorchjob_s3_takes_credentials_only_from_the_secret(pytorchjob_s3):
    from runjob.host.streams import ENDPOINT_VARIABLES

    text = PYTORCHJOB_S3.read_text()
    assert "AWS_EC2_METADATA_DISABLED" not in text, "instance roles (IRSA, node roles) must keep working"
    for name, replica in pytorchjob_s3["spec"]["pytorchReplicaSpecs"].items():
        container = pytorch_container(replica)
        assert container["envFrom"] == [{"secretRef": {"name": "runjob-s3"}}], name
        for entry in container.get("env", []):
            if entry["name"] in CREDENTIAL_VARIABLES or entry["name"].startswith(("AWS_", "GOOGLE_")):
                assert "value" not in entry, f"{name}: {entry['name']} has a literal value in the manifest"
                assert entry["valueFrom"]["secretKeyRef"]["name"] == "runjob-s3", entry
        words = [str(w) for w in container["args"]]
        assert not [w for w in words if re.search(r"AWS_|GOOGLE_|secret|key_id", w, re.I)], words
    # the documented Secret has the keys boto3 reads from the environment, and only such keys
    words = secret_line(text)
    literals = dict(w.removeprefix("--from-literal=").split("=", 1) for w in words if w.startswith("--from-literal="))
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(literals) <= CREDENTIAL_VARIABLES, literals
    assert len(literals) == len(words) - 5, "every key given as --from-literal=NAME=VALUE"
    # the one other key shown, for an S3-compatible store's endpoint, is a name runjob reads
    (endpoint,) = [m for m in re.findall(r"--from-literal=(\w+)=(\S+)", text) if m[0] not in literals]
    assert endpoint[0] in ENDPOINT_VARIABLES and urlparse(endpoint[1]).scheme in ("http", "https"), endpoint


def test_pytorchjob_s3_caches_shards_on_a_node_local_volume_that_holds_the_cache_limit(pytorchjob_s3):
    from runjob.host.streams import parse_size

    for name, replica in pytorchjob_s3["spec"]["pytorchReplicaSpecs"].items():
        pod = replica["template"]["spec"]
        container = pytorch_container(replica)
        overrides = set_values(expanded_command(pytorchjob_s3, name))
        cache_dir = PurePosixPath(overrides["dataset.cache_dir"])
        (mount,) = [m for m in container["volumeMounts"] if cache_dir.is_relative_to(m["mountPath"])]
        assert not mount.get("readOnly"), name
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        scratch = volume["emptyDir"]  # node-local, gone with the pod
        assert scratch.get("medium") != "Memory", "the shards would count against the pod's memory"
        size = k8s_bytes(scratch["sizeLimit"])
        # runjob keeps the whole cache (its splits share it) under cache_limit; past sizeLimit the pod is evicted
        limit = parse_size(overrides["dataset.cache_limit"])
        assert limit < size <= 2 * limit, (overrides["dataset.cache_limit"], scratch["sizeLimit"])
        # the scheduler puts the pod on a node with that much disk free
        assert k8s_bytes(container["resources"]["requests"]["ephemeral-storage"]) >= size, name


# ---------------------------------------------------------------------------------------------
# slurm/train-s3.sbatch: train.sbatch with --set dataset.location=$RUNJOB_DATA and a node-local cache


def run_sbatch_s3(fake_slurm, *args: str, **extra: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SBATCH_S3), *args],
        cwd=REPO,
        env=fake_slurm.env(**extra),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sbatch_s3_is_valid_bash_with_strict_mode_and_train_sbatchs_header():
    proc = subprocess.run(["bash", "-n", str(SBATCH_S3)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    text = SBATCH_S3.read_text()
    assert re.search(r"^set -euo pipefail$", text, re.M)
    assert "AWS_EC2_METADATA_DISABLED" not in text, "instance roles must keep working"

    def header(script: Path) -> list[str]:
        return re.findall(r"^#SBATCH .*$", script.read_text(), re.M)

    assert header(SBATCH_S3) == header(SBATCH), "sbatch reads only the submitted script's #SBATCH lines"


def test_sbatch_s3_renders_train_sbatchs_command_with_the_location_and_the_cache(fake_slurm):
    from runjob.job.jobfile import parse_override_value

    proc = run_sbatch_s3(
        fake_slurm,
        "jobs/digits.toml",
        "--set",
        "train.epochs=1",
        RUNJOB_DATA="s3://my-bucket/digits",
        SLURM_TMPDIR="/localscratch/alice.4242.0",
    )
    assert proc.returncode == 0, proc.stderr
    srun, torchrun = launch_words(proc.stdout)
    args = parse_torchrun(torchrun)
    assert args.training_script_args == [
        "jobs/digits.toml",
        "--output-dir",
        "runs/slurm-4242",
        "--resume",
        "auto",
        "--set",
        "dataset.location=s3://my-bucket/digits",
        "--set",
        "dataset.cache_dir=/localscratch/alice.4242.0/runjob-streams",
        "--set",
        "train.epochs=1",  # the caller's flags last: a --set of theirs wins
    ]
    overrides = set_values(args.training_script_args)
    for key in ("dataset.location", "dataset.cache_dir"):
        assert isinstance(parse_override_value(overrides[key]), str), "runjob must read the value as a string"
    # otherwise train.sbatch's launch: the same srun and torchrun options
    plain = fake_slurm("jobs/digits.toml")
    assert plain.returncode == 0, plain.stderr
    plain_srun, plain_torchrun = launch_words(plain.stdout)
    assert srun == plain_srun
    assert torchrun[: torchrun.index("runjob")] == plain_torchrun[: plain_torchrun.index("runjob")]


@pytest.mark.parametrize(
    ("data", "tmpdir", "cache_dir"),
    [
        ("gs://my-bucket/digits", None, "/tmp/alice/runjob-streams"),
        ("/shared/shards/digits", None, "/tmp/alice/runjob-streams"),
        ("s3://my-bucket/digits", "/local/job", "/local/job/runjob-streams"),
    ],
)
def test_sbatch_s3_takes_gs_and_folders_and_caches_in_slurm_tmpdir_else_tmp(fake_slurm, data, tmpdir, cache_dir):
    proc = run_sbatch_s3(fake_slurm, "jobs/digits.toml", RUNJOB_DATA=data, SLURM_TMPDIR=tmpdir, USER="alice")
    assert proc.returncode == 0, proc.stderr
    overrides = set_values(parse_torchrun(launch_words(proc.stdout)[1]).training_script_args)
    assert overrides == {"dataset.location": data, "dataset.cache_dir": cache_dir}


def test_sbatch_s3_passes_credentials_in_the_environment_not_on_the_command_line(fake_slurm):
    (fake_slurm.dir / "bin" / "srun").write_text(FAKE_SRUN.replace("\n", '\nenv > "$FAKE_DIR/srun.env"\n', 1))
    secrets = {"AWS_ACCESS_KEY_ID": "AKIAFAKEKEYID0000042", "AWS_SECRET_ACCESS_KEY": "fake/secret+key+0042"}
    proc = run_sbatch_s3(
        fake_slurm, "jobs/digits.toml", RUNJOB_DATA="s3://my-bucket/digits", AWS_DEFAULT_REGION="eu-west-1", **secrets
    )
    assert proc.returncode == 0, proc.stderr
    for value in secrets.values():
        assert value not in proc.stdout and value not in proc.stderr, "a credential on the command line or in the log"
    environment = dict(
        line.split("=", 1) for line in (fake_slurm.dir / "srun.env").read_text().splitlines() if "=" in line
    )
    for name, value in {**secrets, "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        assert environment.get(name) == value, f"{name} does not reach srun (and so its tasks)"
    assert "AWS_EC2_METADATA_DISABLED" not in environment
    assert not [w for w in proc.stdout.splitlines() if w.startswith("--export")], "srun passes the environment on"


def test_sbatch_s3_dry_run_prints_the_same_command_and_starts_nothing(fake_slurm):
    data = {"RUNJOB_DATA": "s3://my-bucket/digits", "SLURM_TMPDIR": "/local/job"}
    dry = run_sbatch_s3(fake_slurm, "jobs/digits.toml", RUNJOB_DRY_RUN="1", **data)
    assert dry.returncode == 0, dry.stderr
    assert not (fake_slurm.dir / "srun.pid").exists(), "srun was started"
    real = run_sbatch_s3(fake_slurm, "jobs/digits.toml", **data)
    assert real.returncode == 0, real.stderr
    words = shlex.split(dry.stdout)
    assert words[0] == "srun" and words[1:] == real.stdout.splitlines()


def test_sbatch_s3_defaults_to_the_streamed_job(fake_slurm):
    proc = run_sbatch_s3(fake_slurm, RUNJOB_DATA="s3://my-bucket/digits")
    assert proc.returncode == 0, proc.stderr
    assert parse_torchrun(launch_words(proc.stdout)[1]).training_script_args[0] == STREAMED_JOB


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"RUNJOB_DATA": None}, "RUNJOB_DATA is not set"),
        ({"RUNJOB_DATA": ""}, "RUNJOB_DATA is not set"),
        ({"RUNJOB_DATA": "my-bucket/digits"}, "RUNJOB_DATA=my-bucket/digits is not"),
        ({"RUNJOB_DATA": "shards/digits"}, "RUNJOB_DATA=shards/digits is not"),
        ({"RUNJOB_DATA": "https://my-bucket.s3.amazonaws.com/digits"}, "RUNJOB_DATA=https://"),
        ({"RUNJOB_DATA": "s3://"}, "RUNJOB_DATA=s3:// is not"),
        ({"RUNJOB_DATA": "s3://my-bucket/digits", "AWS_ACCESS_KEY_ID": "AKIAFAKE"}, "AWS_SECRET_ACCESS_KEY is not"),
        (
            {"RUNJOB_DATA": "gs://my-bucket/digits", "GOOGLE_APPLICATION_CREDENTIALS": "/no/such/key.json"},
            "GOOGLE_APPLICATION_CREDENTIALS=/no/such/key.json is not a readable file",
        ),
    ],
    ids=["unset", "empty", "no-scheme", "relative", "https", "no-bucket", "half-credentials", "missing-key-file"],
)
def test_sbatch_s3_refuses_in_one_line_before_srun(fake_slurm, extra, named):
    proc = run_sbatch_s3(fake_slurm, "jobs/digits.toml", **extra)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and named in proc.stderr and not proc.stdout, proc.stderr
    assert proc.stderr.startswith("train-s3.sbatch: ")
    assert not (fake_slurm.dir / "srun.pid").exists(), "srun was started"


def test_sbatch_s3_time_limit_signal_reaches_train_sbatchs_handler(fake_slurm):
    """Slurm sends USR1 to the batch script's process (--signal=B:USR1@120): train-s3.sbatch must
    have become train.sbatch (exec), whose handler requeues the job."""
    process = subprocess.Popen(
        ["bash", str(SBATCH_S3), "jobs/digits.toml"],
        cwd=REPO,
        env=fake_slurm.env(RUNJOB_DATA="s3://my-bucket/digits", RUNJOB_REQUEUE="1", FAKE_SRUN_SLEEP="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_file = fake_slurm.dir / "srun.pid"
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "srun never started"
        time.sleep(0.2)
        process.send_signal(signal.SIGUSR1)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert (fake_slurm.dir / "scontrol.log").read_text().split() == ["requeue", "4242"], stderr
    assert process.returncode == 0, stderr


# ---------------------------------------------------------------------------------------------
# Both object-store recipes: the streamed job they run, and the README


def test_object_store_recipes_run_a_streamed_job_that_takes_their_overrides(pytorchjob_s3, fake_slurm):
    """What both recipes run resolves: the job has a streamed dataset, and every --set dataset.X
    they add is one of its options, read back as given."""
    from runjob.host.plugin_host import load_plugins
    from runjob.host.streams import StreamOptions
    from runjob.job.validation import load_resolved

    host = load_plugins()
    manifest = parse_torchrun(expanded_command(pytorchjob_s3, "Master")[1:]).training_script_args
    proc = run_sbatch_s3(fake_slurm, RUNJOB_DATA="s3://my-bucket/digits", SLURM_TMPDIR="/local/job")
    assert proc.returncode == 0, proc.stderr
    sbatch = parse_torchrun(launch_words(proc.stdout)[1]).training_script_args
    for words in (manifest, sbatch):
        overrides = [f"{key}={value}" for key, value in set_values(words).items()]
        options = load_resolved(REPO / words[0], overrides, host).dataset.options
        assert isinstance(options, StreamOptions), type(options)
        for override in overrides:
            key, _, value = override.partition("=")
            assert str(getattr(options, key.removeprefix("dataset."))) == value, override


def test_object_store_recipes_are_documented(pytorchjob_s3):
    readme = (CONTAINERS / "README.md").read_text()
    assert "## Data from an object store" in readme
    for path in ("slurm/train-s3.sbatch", "k8s/pytorchjob-s3.yaml"):
        assert re.search(rf"^\| `{re.escape(path)}` \|", readme, re.M), f"{path} is missing from the table"
    assert "kubectl apply -f containers/k8s/pytorchjob-s3.yaml" in readme
    assert secret_line(readme) == secret_line(PYTORCHJOB_S3.read_text()), "the README's Secret is the manifest's"
    assert re.search(r"^RUNJOB_DATA=s3://\S+ sbatch containers/slurm/train-s3\.sbatch", readme, re.M)
    assert re.search(r"^runjob data convert \S+ s3://\S+", readme, re.M)
    args = [str(word) for word in pytorch_container(pytorchjob_s3["spec"]["pytorchReplicaSpecs"]["Master"])["args"]]
    for key, value in set_values(args).items():
        assert f"{key}={value}" in readme, key


def test_the_image_has_the_stream_extra_the_object_store_manifest_needs():
    installs = pip_installs(dockerfile_instructions())
    assert any("stream" in extras(target) for _, targets, _ in installs for target in targets)
