"""Block decode time of the text column with and without Parquet dictionary encoding.

Why the corpus writer turns dictionaries off for unique-valued columns (pipeline/format.py).
Usage: .venv/bin/python benchmarks/parquet_dictionary.py CORPUS [--rows 6000] [--repeats 5]
(CORPUS: any gristmill corpus, e.g. the loader benchmark's bench-data/loader/gristmill).
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.format import Corpus


def decode_seconds(data: bytes, repeats: int) -> float:
    """Median time to decode every row group's text into Python strings, as a loader does."""
    times = []
    for _ in range(repeats):
        parquet = pq.ParquetFile(pa.BufferReader(data))
        start = time.perf_counter()
        for index in range(parquet.num_row_groups):
            parquet.read_row_group(index, columns=["text"], use_threads=False).column("text").to_pylist()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    corpus = Corpus.open(args.corpus)
    table = corpus.read_shard(corpus.shards[0], ["id", "text"]).slice(0, args.rows)
    results = {}
    for label, use_dictionary in [("dictionary on", True), ("dictionary off for text", ["id"])]:
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd", row_group_size=300, use_dictionary=use_dictionary)
        results[label] = (decode_seconds(sink.getvalue(), args.repeats), len(sink.getvalue()))
    base = results["dictionary on"][0]
    print(f"{table.num_rows} documents, {args.repeats} repeats, median")
    for label, (seconds, size) in results.items():
        print(f"{label:24s} {seconds:.3f} s  {size / 1e6:.1f} MB  time ratio {seconds / base:.2f}")


if __name__ == "__main__":
    main()
