"""``runjob data convert SOURCE LOCATION``: shards for streamed datasets (:mod:`runjob.train.shards`)."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from runjob.errors import DataError
from runjob.host.streams import StreamOptions, parse_size


def cmd_data(args: argparse.Namespace) -> int:
    # lazy: LitData and the stores' clients load only when a conversion runs, after its arguments are checked
    from runjob.train.shards import convert_image_folder

    try:
        stream = StreamOptions(location=args.location, endpoint_url=args.endpoint_url)
        if args.chunk_bytes != "auto":
            parse_size(args.chunk_bytes)
    except (ValidationError, ValueError) as error:
        problem = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
        raise DataError(f"runjob data convert: {problem.removeprefix('Value error, ')}") from None
    if args.workers < 1:
        raise DataError(f"runjob data convert: --workers {args.workers}: give 1 or more")
    if not args.source.is_dir():
        raise DataError(
            f"runjob data convert: {args.source}: no such folder (an image folder: train/<class>/, val/<class>/)"
        )
    convert_image_folder(
        args.source.resolve(), stream, chunk_bytes=args.chunk_bytes, workers=args.workers, overwrite=args.overwrite
    )
    return 0
