"""The recording pipe's codec (``runjob.record.messages``): CPU microseconds to encode and to decode
one message, over a mix a run sends (a metrics message of 8 points, tags, a model reply, the end).

    uv run python benchmarks/message_codec.py

Prints seven rounds of 5,000 x 4 messages each and their medians (CPU time, so another process on
the machine matters less than for wall time). RESULTS.md section 11 has the numbers.
"""

from __future__ import annotations

import statistics
import time

from runjob.record import messages as m


def main() -> None:
    points = tuple(m.Point(f"train/k{i}", 0.5 + i, 100, 1733400000000 + i) for i in range(8))
    said = [m.Metrics(points), m.Tags({"a": "b", "c": "d"}), m.ModelWritten("f", ("n1",), None), m.End("FINISHED", 1)]
    lines = [m.encode(x) for x in said]
    assert [m.decode(line) for line in lines] == said
    encoding, decoding = [], []
    for _ in range(7):
        began = time.process_time()
        for _ in range(5000):
            for message in said:
                m.encode(message)
        encoding.append((time.process_time() - began) / 20000 * 1e6)
        began = time.process_time()
        for _ in range(5000):
            for line in lines:
                m.decode(line)
        decoding.append((time.process_time() - began) / 20000 * 1e6)
    for name, values in (("encode", encoding), ("decode", decoding)):
        print(f"{name} us/message (CPU): {[round(v, 2) for v in values]}, median {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
