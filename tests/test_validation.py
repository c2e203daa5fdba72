"""Checking whole jobs before anything runs: every problem reported, each with file, line and key."""

from __future__ import annotations

import tomllib

import pytest

from runjob.errors import JobError
from runjob.host.plugin_host import load_plugins
from runjob.job.validation import load_resolved
from runjob.testing import write_job

CONTRACT = """
    [job]
    name = "digits-png-resnet18"
    seed = 0

    [model]
    name = "resnet18"
    num_classes = 10

    [dataset]
    name = "imagefolder"
    root = "{root}"

    [optimizer]
    name = "adam"
    lr = 0.001

    [train]
    epochs = 3
    batch_size = 32
"""


@pytest.fixture(scope="module")
def host():
    return load_plugins()


@pytest.fixture
def contract(tmp_path, digits_folder):
    return write_job(tmp_path / "job.toml", CONTRACT.format(root=digits_folder))


def problems(path, host, overrides=()):
    with pytest.raises(JobError) as caught:
        load_resolved(path, list(overrides), host)
    return [str(p) for p in caught.value.problems]


def test_contract_job_resolves_with_defaults(contract, host, digits_folder):
    job = load_resolved(contract, [], host)
    assert job.model.name == "resnet18" and job.model.options.num_classes == 10
    assert job.dataset.options.root == str(digits_folder)
    assert job.train.epochs == 3 and job.train.batch_size == 32
    assert job.scheduler.name == "none" and job.strategy.name == "ddp"
    assert job.optimizer.options.lr == 0.001


def test_resolved_toml_reads_back_to_the_same_job(contract, host, tmp_path):
    job = load_resolved(contract, ["optimizer.lr=0.05", "scheduler.name=cosine"], host)
    text = job.to_toml()
    again = load_resolved(write_job(tmp_path / "resolved.toml", text), [], host)
    assert again.to_dict() == job.to_dict()
    assert tomllib.loads(text)["optimizer"]["lr"] == 0.05


def test_every_problem_is_reported_with_file_line_and_key(tmp_path, host, digits_folder):
    job = write_job(
        tmp_path / "job.toml",
        f"""
        [job]
        name = "x"
        [model]
        name = "resnt18"
        [dataset]
        name = "imagefolder"
        root = "{digits_folder}"
        colour = "red"
        [optimizer]
        name = "sgd"
        lr = -0.1
        [train]
        epochs = -1
        batch_size = "32"
        [trian]
        epochs = 1
    """,
    )
    found = problems(job, host)
    assert len(found) == 6, found
    assert found == sorted(found, key=lambda p: int(p.split(":")[1])), "problems come in file order"
    text = "\n".join(found)
    assert f"{job}:15: trian: unknown table; did you mean [train]?" in text
    assert f"{job}:13: train.epochs: Input should be greater than or equal to 1 (got -1)" in text
    assert f"{job}:14: train.batch_size: Input should be a valid integer (got '32')" in text
    assert f"{job}:4: model.name: unknown model 'resnt18'; did you mean 'resnet18'" in text
    assert f"{job}:8: dataset.colour: unknown key" in text
    assert f"{job}:11: optimizer.lr: Input should be greater than 0 (got -0.1)" in text


def test_a_mistake_in_a_set_override_names_the_override(contract, host):
    found = problems(
        contract, host, ["trian.epochs=2", "train.epochs=0", "optimizer.lr=0.5", "tracking.api_token=hunter2"]
    )
    assert found[0].startswith("--set trian.epochs=2: trian: unknown table; did you mean [train]?"), found
    assert "--set train.epochs=0: train.epochs: Input should be greater than or equal to 1 (got 0)" in found
    assert found[2].startswith("--set tracking.api_token=***: tracking.api_token: unknown key"), "secrets stay hidden"
    assert len(found) == 3 and not any("hunter2" in p for p in found)


def test_unknown_component_option_suggests_the_right_key(contract, host):
    found = problems(contract, host, ["optimizer.learning_rate=0.1", "model.num_class=3"])
    assert any(
        "optimizer.learning_rate: unknown key. Accepted keys: name, betas, eps, foreach, fused, groups, lr, "
        "no_decay_norm_and_bias, weight_decay" in p
        for p in found
    )
    assert any("model.num_class: unknown key; did you mean 'num_classes'?" in p for p in found)


def test_missing_folder_is_named(tmp_path, host):
    job = write_job(tmp_path / "job.toml", CONTRACT.format(root="no/such/folder"))
    (found,) = problems(job, host)
    assert f"dataset.root: folder not found: {(tmp_path.cwd() / 'no/such/folder').resolve()}" in found


def test_imagefolder_needs_matching_train_and_val_classes(tmp_path, host):
    for split, classes in (("train", ["cat", "dog"]), ("val", ["cat", "bird"])):
        for name in classes:
            (tmp_path / "imgs" / split / name).mkdir(parents=True)
    job = write_job(tmp_path / "job.toml", CONTRACT.format(root=tmp_path / "imgs"))
    (found,) = problems(job, host)
    assert "only in train: ['dog'], only in val: ['bird']" in found


def test_model_and_dataset_are_required(tmp_path, host):
    job = write_job(tmp_path / "job.toml", "[train]\nepochs = 1\n")
    found = problems(job, host)
    assert any("model.name: required: which model to use, one of:" in p for p in found)
    assert any("dataset.name: required: which dataset to use, one of:" in p and "imagefolder" in p for p in found)


def test_table_given_as_a_value(tmp_path, host):
    job = write_job(tmp_path / "job.toml", 'model = "resnet18"\n')
    found = problems(job, host)
    assert f"{job}:1: model: must be a table ([model]), got 'resnet18'" in found


def test_problems_from_a_base_file_name_the_base(tmp_path, host, digits_folder):
    base = write_job(tmp_path / "base.toml", CONTRACT.format(root=digits_folder).replace("epochs = 3", "epochs = 0"))
    child = write_job(tmp_path / "child.toml", 'extends = "base.toml"\n[optimizer]\nlr = 0.01\n')
    (found,) = problems(child, host)
    assert found.startswith(f"{base}:18: train.epochs:")


def test_cross_key_checks(contract, host):
    found = problems(
        contract,
        host,
        ["dataset.prefetch_factor=2", "optimizer.name=sgd", "optimizer.nesterov=true", "optimizer.momentum=0.0"],
    )
    assert any("need num_workers > 0" in p for p in found)
    assert any("nesterov = true needs momentum > 0" in p for p in found)


def test_max_steps_alone_means_no_epoch_limit(contract, host):
    job = load_resolved(contract, ["train.max_steps=7", "train.epochs=1"], host)
    assert job.train.max_steps == 7 and job.train.epochs == 1
    raw_without_epochs = contract.read_text().replace("epochs = 3\n", "max_steps = 5\n")
    contract.write_text(raw_without_epochs)
    job = load_resolved(contract, [], host)
    assert job.train.epochs is None and job.train.max_steps == 5


def test_cifar10_without_download_needs_a_copy(tmp_path, host):
    job = write_job(
        tmp_path / "job.toml",
        f"""
        [model]
        name = "resnet18"
        [dataset]
        name = "cifar10"
        root = "{tmp_path / "cifar"}"
        download = false
    """,
    )
    (found,) = problems(job, host)
    assert f"dataset.root: folder not found: {tmp_path / 'cifar' / 'cifar-10-batches-py'}" in found


def test_seed_fsdp_setup_is_expressible(contract, host):
    """FULL_SHARD, use_orig_params and fp16, as in the seed article's FSDP snippet."""
    overrides = [
        "strategy.name=fsdp",
        "strategy.fsdp_version=1",
        "strategy.sharding_strategy=FULL_SHARD",
        "strategy.use_orig_params=true",
        "train.mixed_precision=fp16",
    ]
    job = load_resolved(contract, overrides, host)
    assert job.strategy.options.sharding_strategy == "FULL_SHARD" and job.strategy.options.use_orig_params is True
    assert job.train.mixed_precision == "fp16"


def test_fsdp1_options_are_refused_with_fsdp2(contract, host):
    (found,) = problems(contract, host, ["strategy.name=fsdp", "strategy.use_orig_params=true"])
    assert "use_orig_params: FSDP1 only; set fsdp_version = 1" in found


def test_launch_table_is_checked(contract, host):
    found = problems(contract, host, ["launch.num_processes=3", "launch.num_machines=2"])
    assert any("num_processes (3) must be a multiple of num_machines (2)" in p for p in found)
    found = problems(contract, host, ["launch.num_processes=4", "launch.num_machines=2"])
    assert any("several machines need main_process_ip and main_process_port" in p for p in found)


def test_plan_shows_batches_precision_strategy_and_warnings(contract, host):
    from runjob.job.plan import plan_lines

    job = load_resolved(
        contract,
        [
            "launch.num_processes=4",
            "train.gradient_accumulation_steps=2",
            "train.mixed_precision=fp16",
            "strategy.name=fsdp",
            "callbacks.throughput.enabled=false",
        ],
        host,
    )
    text = "\n".join(plan_lines(job, has_gpu=False))
    assert "callbacks: best_weights, peak_memory (switched off: throughput)" in text
    assert "processes: 4 on 1 machine(s), 4 per machine" in text
    assert "batch: 32 per process x 4 = 128 global; gradient accumulation 2 -> 256 samples per optimizer step" in text
    assert "precision: fp16" in text and "strategy: fsdp (fsdp_version=2" in text
    assert "warning: train.mixed_precision = 'fp16' needs a GPU and none is used here" in text
    assert "warning: strategy 'fsdp' needs CUDA GPUs" in text
    assert "warning" not in "\n".join(plan_lines(job, has_gpu=True))


def test_options_accelerate_refuses_become_one_line_errors():
    from runjob.errors import RunjobError
    from runjob_builtins.strategies import FSDPOptions, build_fsdp

    with pytest.raises(
        RunjobError, match="strategy.name = 'fsdp': Accelerate refused these options: .*sync_module_states"
    ):
        build_fsdp(FSDPOptions(fsdp_version=1))  # FSDP1 syncs module states, which needs a GPU
