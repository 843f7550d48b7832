"""Node-local cache: bytes read from object storage per epoch by 2 ranks x 2 workers on one node.

A corpus is written to moto's S3 server on 127.0.0.1; four processes (rank 0-1, worker 0-1, the
loader's own ``rank``/``worker_id`` parameters, shuffle on) read two epochs, each of three ways:
no cache, a cache directory per process (what the ranks and workers of a node shared before: nothing),
and one cache directory for the node. Reported per epoch: bytes the four processes read from storage,
summed from the loader's counters, as a multiple of the corpus's size (shards, footers included).

    .venv-bench/bin/python benchmarks/loader_node_cache.py --mb 24 --repeats 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANKS, WORKERS = 2, 2


def read_two_epochs(url: str, options: dict, cache_dir: str | None, rank: int, worker: int,
                    barrier: multiprocessing.Barrier, queue: multiprocessing.Queue) -> None:
    from gristmill.loaders import StreamingLoader

    loader = StreamingLoader(url, batch_size=32, columns=["text"], rank=rank, world_size=RANKS, worker_id=worker,
                             num_workers=WORKERS, storage_options=options, cache_dir=cache_dir, cache_bytes=8 << 30)
    per_epoch = []
    for _ in range(2):
        barrier.wait()  # the four processes start each epoch together, so bytes are counted to their epoch
        before = loader.counters.as_dict()["bytes_read"]
        sum(len(batch["text"]) for batch in loader)
        per_epoch.append(loader.counters.as_dict()["bytes_read"] - before)
    queue.put(per_epoch)


def run(url: str, options: dict, mode: str) -> list[int]:
    """Bytes read from storage in epochs 1 and 2, summed over the four processes."""
    context = multiprocessing.get_context("spawn")
    queue, node_dir = context.Queue(), tempfile.mkdtemp(prefix="gristmill-node-cache-")
    barrier = context.Barrier(RANKS * WORKERS)
    processes = []
    for rank in range(RANKS):
        for worker in range(WORKERS):
            cache = {"none": None, "per process": os.path.join(node_dir, f"{rank}-{worker}"), "node": node_dir}[mode]
            processes.append(context.Process(target=read_two_epochs, args=(url, options, cache, rank, worker, barrier, queue)))
    for process in processes:
        process.start()
    results = [queue.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    shutil.rmtree(node_dir)
    return [sum(r[epoch] for r in results) for epoch in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=24, help="text in the corpus")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()

    import numpy as np
    import s3fs
    from moto.server import ThreadedMotoServer

    from gristmill.pipeline.format import Corpus, ShardWriter

    for key, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    storage = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(**storage).mkdir(bucket)
    url = f"s3://{bucket}/corpus"
    rng = np.random.default_rng(0)
    words = np.array(["".join(rng.choice(list("abcdefghij"), size=int(rng.integers(2, 9)))) for _ in range(5000)])
    with ShardWriter(url, shard_bytes=4 << 20, row_group_bytes=512 << 10, storage_options=storage) as writer:
        written, index = 0, 0
        while written < options.mb << 20:
            texts = [" ".join(words[rng.integers(0, len(words), int(rng.integers(50, 1500)))]) for _ in range(200)]
            writer.write([{"id": f"d{index + i}", "text": t} for i, t in enumerate(texts)])
            written += sum(map(len, texts))
            index += len(texts)
    writer.commit()
    corpus = Corpus.open(url, storage)
    size = corpus.manifest.num_bytes
    print(f"corpus: {size / 1e6:.1f} MB in {len(corpus.shards)} shards, {len(corpus.manifest.blocks)} row groups; "
          f"{RANKS} ranks x {WORKERS} workers, shuffle on, median of {options.repeats}")
    figures: dict[str, list[list[int]]] = {}
    for _ in range(options.repeats):
        for mode in ("none", "per process", "node"):  # modes alternate, so background load hits them alike
            figures.setdefault(mode, []).append(run(url, storage, mode))
    print(f"{'cache':<14}{'epoch 1':>12}{'epoch 2':>12}   (bytes read from storage / corpus bytes)")
    for mode, runs in figures.items():
        first, second = (statistics.median(r[epoch] for r in runs) / size for epoch in range(2))
        print(f"{mode:<14}{first:>11.2f}x{second:>11.2f}x")
    server.stop()


if __name__ == "__main__":
    main()
