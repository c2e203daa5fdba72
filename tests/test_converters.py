"""``runjob data convert --from NAME``: converters are a plugin kind. A plugin's converter writes shards
that a plugin's streamed dataset trains on, as the built-ins do; a converter's name, options and return
value are checked in one line, exit code 2, before anything is written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("litdata")

PLUGIN = textwrap.dedent(
    '''
    """A plugin's own source: lines of "x,y" numbers, one sample a line; val is every fifth line."""
    from pathlib import Path

    import runjob


    class PairsOptions(runjob.Options):
        scale: float = 1.0


    def pair_record(item):
        return {"id": item[0], "x": item[1], "y": item[2]}


    def convert_pairs(source, options):
        rows = [tuple(float(v) for v in line.split(",")) for line in Path(source).read_text().split()]
        items = [(i, x * options.scale, y) for i, (x, y) in enumerate(rows)]
        splits = {"train": [it for it in items if it[0] % 5], "val": [it for it in items if not it[0] % 5]}
        return runjob.ShardSource(
            splits=splits,
            record=pair_record,
            digests={name: str(hash(tuple(part))) for name, part in splits.items()},
            source=str(source),
            facts={"columns": ["x", "y"]},
        )


    def broken(source, options):
        return {"not": "a ShardSource"}


    class PairsDataOptions(runjob.StreamOptions):
        pass


    def to_sample(record, draw):
        import torch

        return torch.tensor([record["x"]]), torch.tensor([record["y"]])


    def build_pairs(options):
        manifest = runjob.stream_manifest(options)
        splits = manifest["splits"]

        def split(name):
            return runjob.Streamed(options, name, to_sample, splits[name]["samples"], splits[name]["digest"])

        return runjob.DatasetSplits(train=split("train"), val=split("val"), source=options.location, digest="pairs")


    @runjob.hookimpl
    def runjob_register_converters(register):
        register("pairs", convert_pairs, options=PairsOptions, description="x,y lines")
        register("broken", broken, description="returns the wrong thing")


    @runjob.hookimpl
    def runjob_register_datasets(register):
        register("pairs_streamed", build_pairs, options=PairsDataOptions, description="x,y pairs, streamed")
    '''
)


@pytest.fixture
def pairs(tmp_path: Path, monkeypatch) -> Path:
    """The plugin file (on $RUNJOB_PLUGINS) and a source of 40 lines, y = 2x + 1."""
    (tmp_path / "pairs_plugin.py").write_text(PLUGIN)
    monkeypatch.setenv("RUNJOB_PLUGINS", str(tmp_path / "pairs_plugin.py"))
    monkeypatch.setenv("RUNJOB_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "pairs.txt"
    source.write_text("\n".join(f"{x / 40},{2 * x / 40 + 1}" for x in range(40)) + "\n")
    return source


def convert(*arguments: str) -> int:
    from runjob.commands.cli import main

    return main(["data", "convert", *arguments])


def one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow
def test_a_conversion_without_progress_bars_writes_the_same_shards(pairs, tmp_path, monkeypatch, capsys):
    """``TQDM_DISABLE=1`` (no bars, as a CI log wants) converts as before: LitData's bar left out,
    not drawn (as a command, LitData 0.2.76 redrew its disabled bar and failed with an AttributeError)."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    location = tmp_path / "shards"
    assert convert(str(pairs), str(location), "--from", "pairs", "--workers", "2") == 0
    manifest = json.loads((location / "runjob.json").read_text())
    assert {name: split["samples"] for name, split in manifest["splits"].items()} == {"train": 32, "val": 8}
    assert "it/s" not in capsys.readouterr().err  # no bar drawn


@pytest.mark.slow
def test_a_plugins_converter_writes_shards_its_streamed_dataset_reads(pairs, tmp_path):
    from test_streaming import loader

    from runjob.host.plugin_host import load_plugins

    location = tmp_path / "shards"
    assert convert(str(pairs), str(location), "--from", "pairs", "-o", "scale=2.0", "--workers", "2") == 0
    manifest = json.loads((location / "runjob.json").read_text())
    assert manifest["kind"] == "pairs" and manifest["columns"] == ["x", "y"]
    assert {name: split["samples"] for name, split in manifest["splits"].items()} == {"train": 32, "val": 8}

    dataset = load_plugins().components["dataset"]["pairs_streamed"]
    splits = dataset.factory(dataset.options(location=str(location)))
    stream = loader(splits.train, workers=2, batch_size=5)
    stream.set_epoch(0)
    seen = [(round(float(x), 6), round(float(y), 6)) for xs, ys in stream for x, y in zip(xs, ys, strict=True)]
    expected = [(round(2 * i / 40, 6), round(2 * i / 40 + 1, 6)) for i in range(40) if i % 5]
    assert sorted(seen) == sorted(expected)  # every training sample once, the option applied (x scaled by 2)


def test_converter_name_and_options_are_checked_in_one_line_before_anything_is_written(pairs, tmp_path, capsys):
    location = tmp_path / "shards"
    err = one_line_error(capsys, convert(str(pairs), str(location), "--from", "nope"))
    assert "--from nope: no such converter; the converters: " in err and "images, pairs" in err
    err = one_line_error(capsys, convert(str(pairs), str(location), "--from", "pairs", "-o", "scale"))
    assert "-o 'scale': write KEY=VALUE" in err
    err = one_line_error(capsys, convert(str(pairs), str(location), "--from", "pairs", "-o", "scale=big"))
    assert "-o scale = 'big'" in err and "number" in err
    err = one_line_error(capsys, convert(str(pairs), str(location), "--from", "pairs", "-o", "colour=1"))
    assert "-o colour: not an option of converter 'pairs'; its options: scale" in err
    err = one_line_error(capsys, convert(str(pairs), str(location), "--from", "broken"))
    assert "returned dict, not a runjob.ShardSource" in err and "pairs_plugin" in err
    err = one_line_error(capsys, convert(str(pairs), str(location)))  # --from images, the default
    assert err.endswith(f"--from images: {pairs}: no such folder (an image folder: train/<class>/, val/<class>/)")
    assert not location.exists()
