"""``runjob data convert SOURCE LOCATION [--from NAME] [-o KEY=VALUE ...]``: shards for streamed datasets
(:mod:`runjob.train.shards`), read by a converter a plugin registers (``runjob_register_converters``)."""

from __future__ import annotations

import argparse
import tomllib

from pydantic import ValidationError

from runjob.errors import ComponentError, DataError, RunjobError, describe
from runjob.host.plugin_host import load_plugins
from runjob.host.streams import ShardSource, StreamOptions, parse_size


def cmd_data(args: argparse.Namespace) -> int:
    # lazy: LitData and the stores' clients load only when a conversion runs, after its arguments are checked
    from runjob.train.shards import write_shards

    try:
        stream = StreamOptions(location=args.location, endpoint_url=args.endpoint_url)
        if args.chunk_bytes != "auto":
            parse_size(args.chunk_bytes)
    except (ValidationError, ValueError) as error:
        message = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
        raise DataError(f"runjob data convert: {message.removeprefix('Value error, ')}") from None
    if args.workers < 1:
        raise DataError(f"runjob data convert: --workers {args.workers}: give 1 or more")
    converters = load_plugins().components["converter"]
    if args.source_kind not in converters:
        known = ", ".join(sorted(converters)) or "none"
        raise DataError(
            f"runjob data convert: --from {args.source_kind}: no such converter; the converters: {known} "
            "(`runjob plugins --long` describes them)"
        )
    converter = converters[args.source_kind]
    where = f"runjob data convert --from {args.source_kind}"
    given = converter_options(args.option or [], where)
    try:
        options = converter.options.model_validate(given)
    except ValidationError as error:
        problem = error.errors()[0]
        key = ".".join(str(part) for part in problem["loc"])
        if not key:  # a check of the options together
            raise DataError(f"{where}: {problem['msg'].removeprefix('Value error, ')}") from None
        if problem["type"] == "extra_forbidden":
            known = ", ".join(converter.options.model_fields) or "none"
            raise DataError(
                f"{where}: -o {key}: not an option of converter {args.source_kind!r}; its options: {known}"
            ) from None
        value = f" = {problem['input']!r}" if key in given else ""
        raise DataError(f"{where}: -o {key}{value}: {problem['msg'].removeprefix('Value error, ')}") from None
    try:
        source = converter.factory(args.source, options)
    except RunjobError as error:
        raise DataError(f"{where}: {error}") from None
    except (ValueError, OSError) as error:
        raise DataError(f"{where}: {describe(error)}") from None
    except Exception as error:  # noqa: BLE001 - a broken plugin is one line, not a traceback
        raise ComponentError(f"{where} (plugin {converter.plugin}) failed: {describe(error)}") from error
    if not isinstance(source, ShardSource):
        raise ComponentError(
            f"{where} (plugin {converter.plugin}) returned {type(source).__name__}, not a runjob.ShardSource"
        )
    write_shards(
        args.source_kind, source, stream, chunk_bytes=args.chunk_bytes, workers=args.workers, overwrite=args.overwrite
    )
    return 0


def converter_options(pairs: list[str], where: str) -> dict[str, object]:
    """``-o KEY=VALUE`` pairs as a dict: VALUE read as a TOML value (``0.2``, ``true``, ``["a", "b"]``,
    ``"text"``), else as the text it is (``-o target=label``)."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise DataError(f"{where}: -o {pair!r}: write KEY=VALUE, such as -o val_fraction=0.2")
        if key in options:
            raise DataError(f"{where}: -o {key} is given twice")
        try:
            options[key] = tomllib.loads(f"value = {text.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            options[key] = text.strip()
    return options
