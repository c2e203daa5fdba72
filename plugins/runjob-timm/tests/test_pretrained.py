"""`pretrained = true`: timm's weights are read from the local Hugging Face cache only (a cache
written here, in the hub's layout: blobs named by their sha256, snapshots linking to them), checked
against their hash, and adapted by timm's own loader; a missing file is one line saying where to
put it; nothing is downloaded."""

import hashlib
import os

import pytest
from runjob_timm import TimmOptions, build_timm
from runjob_timm.pretrained import find_in_torch_cache
from timm_jobs import VIT, digits_job

import runjob

REPO = "timm/test_vit.r160_in1k"  # test_vit's default weights, as timm's config names them


def cache_file(cache, repo: str, filename: str, content: bytes, commit: str = "c0ffee" * 6 + "abcd"):
    """``content`` as the hub's cache keeps a downloaded file; returns its blob."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha256(content).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(content)
    link = folder / "snapshots" / commit / filename
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return blob


@pytest.fixture(scope="module")
def published():
    """test_vit's weights as timm would publish them (1000 classes, 160x160 images), randomly made."""
    import timm
    import torch
    from safetensors.torch import save

    torch.manual_seed(1)
    state = {k: v.contiguous() for k, v in timm.create_model("test_vit").state_dict().items()}
    return state, save(state)


@pytest.fixture
def no_downloads(monkeypatch):
    """Every way timm and huggingface_hub download fails the test."""
    import huggingface_hub
    import timm.models._builder
    import timm.models._hub

    def refuse(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args} {kwargs}")

    for module in (huggingface_hub, huggingface_hub.file_download, timm.models._hub):
        monkeypatch.setattr(module, "hf_hub_download", refuse)
    for name in ("load_state_dict_from_url", "download_cached_file"):
        monkeypatch.setattr(timm.models._builder, name, refuse)


def test_weights_come_from_the_cache_checked_and_adapted(tmp_path, monkeypatch, capsys, published, no_downloads):
    state, content = published
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    blob = cache_file(tmp_path / "hub", REPO, "model.safetensors", content)

    facts = runjob.DataFacts(num_classes=10, channels=3, image_size=32)
    model = build_timm(TimmOptions(arch="test_vit", pretrained=True), facts)
    loaded = model.state_dict()
    for key in ("blocks.0.attn.qkv.weight", "blocks.5.mlp.fc2.bias", "patch_embed.proj.weight", "cls_token"):
        assert loaded[key].equal(state[key]), key
    assert tuple(loaded["head.weight"].shape) == (10, 64), "a fresh head for the dataset's 10 classes"
    assert tuple(loaded["pos_embed"].shape) == (1, 1 + 2 * 2, 64), "resampled for 32x32 images: 2x2 patches"
    said = capsys.readouterr().out.splitlines()
    link = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / ("c0ffee" * 6 + "abcd")
    assert said == [f"runjob: model.pretrained: timm test_vit from {link / 'model.safetensors'} (sha256 checked)"]

    # a file that is not the one the hub published: the blob's name is its sha256
    blob.write_bytes(content[:-8] + b"\0" * 8)
    with pytest.raises(
        runjob.RunjobError, match=r"is not the file the hub published: its sha256 is [0-9a-f]{12}\.\.\."
    ):
        build_timm(TimmOptions(arch="test_vit", pretrained=True), facts)


def test_missing_weights_are_one_line_saying_where_to_put_them(tester, monkeypatch, no_downloads):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    job = tester.write_job(
        "job.toml", digits_job("timm-pretrained", VIT.replace("kwargs", "pretrained = true\n    kwargs"))
    )
    result = tester.cli("job.toml")
    assert result.returncode == 2
    cache = tester.path / "hf_home" / "hub"  # the test's own HF_HOME
    line = next(n for n, text in enumerate(job.read_text().splitlines(), 1) if text.startswith("[model]"))
    assert result.stderr_lines[-1] == (
        f"runjob: job.toml:{line + 1}: [model] timm: model.pretrained: timm test_vit ({REPO}): model.safetensors is "
        f"not in the Hugging Face cache {cache} and runjob-timm does not download (offline, as HF_HUB_OFFLINE=1); "
        f"place it there from a machine with internet: `hf download {REPO} model.safetensors --cache-dir {cache}` "
        "(the folder is $HF_HUB_CACHE, else $HF_HOME/hub)"
    )
    assert "Traceback" not in result.stderr


def test_weights_published_at_a_url_are_read_from_torch_s_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    folder = tmp_path / "torch" / "hub" / "checkpoints"
    folder.mkdir(parents=True)
    content = b"weights"
    name = f"net-{hashlib.sha256(content).hexdigest()[:8]}.pth"
    url = f"https://example.org/releases/{name}"
    with pytest.raises(runjob.RunjobError, match=f"{name} is not in {folder} and runjob-timm does not download"):
        find_in_torch_cache("net", url)
    (folder / name).write_bytes(content)
    assert find_in_torch_cache("net", url).checked == "sha256 checked"
    (folder / name).write_bytes(b"other")
    with pytest.raises(runjob.RunjobError, match="is not the file published at"):
        find_in_torch_cache("net", url)
