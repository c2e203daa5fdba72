"""``pretrained = true``: timm's weights from the local cache only, never downloaded.

timm keeps its weights on the Hugging Face hub (``timm/<arch>.<tag>``) and reads them through the
hub's cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``). Here the
file is looked up in that cache and nowhere else, as with ``HF_HUB_OFFLINE=1``: a missing file is
one line naming the architecture, the repository and where to put the file. A cached file is
checked against the hash its cache entry is named by (the hub's blobs are named by their sha256 for
weight files, by their git sha1 for small files) when the cache keeps one, then handed to timm as a
local file, so timm's own loader adapts it as usual (another ``num_classes``: a fresh head; other
``in_chans``: the first convolution adapted; a ViT's other ``img_size``: position embeddings
resampled).

The few timm weights published only at a URL (no hub repository) are looked up the same way in
torch's checkpoint folder (``$TORCH_HOME/hub/checkpoints``), checked against the sha256 prefix their
file name carries, as torchvision's are.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runjob import RunjobError

SAFETENSORS = "model.safetensors"
PICKLE = "pytorch_model.bin"
SHA256_NAME = re.compile(r"[0-9a-f]{64}")
GIT_SHA1_NAME = re.compile(r"[0-9a-f]{40}")
URL_HASH = re.compile(r"-([a-f0-9]*)\.")  # torch.hub's: the sha256 prefix in a checkpoint's file name


@dataclass(frozen=True)
class Weights:
    """A pretrained weights file found in the local cache."""

    path: Path
    source: str
    """Where it comes from: ``timm/<repo>`` on the Hugging Face hub, or the URL."""
    checked: str
    """What was checked: ``sha256 checked``, or why nothing could be."""


def hub_cache() -> Path:
    """The Hugging Face hub cache as ``huggingface_hub`` finds it, read from the environment now
    (``huggingface_hub.constants`` reads it once, at import)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def torch_checkpoints() -> Path:
    """``$TORCH_HOME/hub/checkpoints``, where torch.hub and timm keep weights downloaded from a URL."""
    import torch.hub  # lazy: plugin modules are imported by `runjob validate`, which must not load torch

    return Path(torch.hub.get_dir()) / "checkpoints"


def _hub_filenames(cfg: dict[str, Any]) -> list[str]:
    """The files timm would read from the repository, in its order (safetensors first)."""
    named = cfg.get("hf_hub_filename")
    if not named:
        return [SAFETENSORS, PICKLE]
    if named.endswith(".bin"):
        return [named[: -len(".bin")] + ".safetensors", named]
    return [named]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git_sha1(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # noqa: S324 - git's object id, not security
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_blob(path: Path, what: str) -> str:
    """Check a cached hub file against the hash its blob is named by; the words to show."""
    if not path.is_symlink():
        return "no hash to check: the cache holds a copy, not a link to a blob named by its hash"
    blob = path.resolve()
    if SHA256_NAME.fullmatch(blob.name):
        found, kind = _sha256(blob), "sha256"
    elif GIT_SHA1_NAME.fullmatch(blob.name):
        found, kind = _git_sha1(blob), "git sha1"
    else:
        return "no hash to check: its blob is not named by a hash"
    if found != blob.name:
        raise RunjobError(
            f"{what}: {path} is not the file the hub published: its {kind} is {found[:12]}..., its cache entry "
            f"says {blob.name[:12]}... (a partial download or another file); delete {blob} and its link and download "
            "it again"
        )
    return f"{kind} checked"


def find_on_hub_cache(arch: str, cfg: dict[str, Any]) -> Weights:
    """The cached hub file of ``arch``'s weights (``cfg``: its timm pretrained config)."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load huggingface_hub
    from huggingface_hub import try_to_load_from_cache

    hub_id = cfg["hf_hub_id"]
    repo, _, revision = hub_id.partition("@")
    cache = hub_cache()
    names = _hub_filenames(cfg)
    what = f"model.pretrained: timm {arch} ({repo})"
    for name in names:
        found = try_to_load_from_cache(repo, name, cache_dir=str(cache), revision=revision or None)
        if isinstance(found, str) and Path(found).is_file():
            path = Path(found)
            return Weights(path, f"{repo}/{name}", check_blob(path, what))
    wanted = names[0]
    revision_flag = f" --revision {revision}" if revision else ""
    raise RunjobError(
        f"{what}: {wanted} is not in the Hugging Face cache {cache} and runjob-timm does not download "
        f"(offline, as HF_HUB_OFFLINE=1); place it there from a machine with internet: `hf download {repo} "
        f"{wanted}{revision_flag} --cache-dir {cache}` (the folder is $HF_HUB_CACHE, else $HF_HOME/hub)"
    )


def find_in_torch_cache(arch: str, url: str) -> Weights:
    """The file of weights published at ``url`` in torch's checkpoint folder, checked against the
    sha256 prefix its name carries."""
    filename = os.path.basename(urlparse(url).path)
    folder = torch_checkpoints()
    path = folder / filename
    what = f"model.pretrained: timm {arch}"
    if not path.is_file():
        raise RunjobError(
            f"{what}: {filename} is not in {folder} and runjob-timm does not download (offline); place the file "
            f"from {url} there (the folder is $TORCH_HOME/hub/checkpoints)"
        )
    found = URL_HASH.search(filename)
    prefix = found.group(1) if found else ""
    if not prefix:
        return Weights(path, url, "no hash to check: its name carries none")
    digest = _sha256(path)
    if not digest.startswith(prefix):
        raise RunjobError(
            f"{what}: {path} is not the file published at {url}: its sha256 starts {digest[: len(prefix)]}, its "
            f"name says {prefix} (a partial download or another file); delete it and place the one from {url}"
        )
    return Weights(path, url, "sha256 checked")


def find_weights(arch: str) -> Weights:
    """The local file of timm's pretrained weights for ``arch`` (``name`` or ``name.tag``); a
    RunjobError naming what to place where when they are not there, or when timm has none."""
    # lazy: plugin modules are imported by `runjob validate`, which must not load timm
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(arch)
    if cfg is None:
        raise RunjobError(f"model.pretrained: timm has no pretrained weights for {arch}; set pretrained = false")
    values: dict[str, Any] = cfg.to_dict()  # type: ignore[no-untyped-call]
    if values.get("hf_hub_id"):
        return find_on_hub_cache(arch, values)
    if values.get("url"):
        return find_in_torch_cache(arch, values["url"])
    raise RunjobError(f"model.pretrained: timm's config of {arch} names no weights file; set pretrained = false")
