"""Before any work: what a run depends on (its fingerprint), the index files of its ``--against``
corpora, and whether it may write its folders (``gristmill.pipeline.job.folders``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

from gristmill.pipeline.format import Corpus, CorpusError, open_fs
from gristmill.pipeline.format.signature_index import IndexFile, IndexParams, listed_index_files
from gristmill.pipeline.job.config import DedupConfig, DedupError
from gristmill.pipeline.job.datasets import JOB_RECORD
from gristmill.pipeline.job.folders import FolderError, check_disjoint, check_work_dir, claim
from gristmill.pipeline.job.inputs import InputFile, Split
from gristmill.pipeline.job.prefer import LONGEST, Preference


def job_fingerprint(config: DedupConfig, params: IndexParams, splits: list[Split], index_files: list[IndexFile],
                    preference: Preference = LONGEST) -> str:
    """What the result depends on; a work folder from another job is discarded, not mixed in. (The
    default policy adds nothing: its runs keep the fingerprint, so the file names, they had before.)"""
    payload = {
        # where files are cut, and each file's content identity (a same-length rewrite is another job)
        "splits": [[[p.file.url, p.file.size, p.file.version, p.start, p.end] for p in s.pieces] for s in splits],
        "params": dataclasses.asdict(params), "index": [[f.url, f.bands_url] for f in index_files], "text_column": config.text_column,
        "id_column": config.id_column, "max_doc_bytes": config.max_doc_bytes, "removed": config.removed,
        "shard_bytes": config.shard_bytes, "row_group_bytes": config.row_group_bytes,
    }
    payload.update(config.span_options)
    if preference != LONGEST:
        payload["prefer"] = preference.identity()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def against_index_files(config: DedupConfig, params: IndexParams) -> list[IndexFile]:
    """The index files of every ``--against`` corpus, in the order given, each corpus checked to have
    been hashed the same way: each file becomes a pseudo-split."""
    return [name for url in config.against for name in _index_files(url, config, params)]


def _index_files(url: str, config: DedupConfig, params: IndexParams) -> list[IndexFile]:
    """The index files of one earlier corpus, after checking it was hashed the same way."""
    try:
        corpus = Corpus.open(url, config.storage_options)
    except CorpusError as exc:
        raise DedupError(f"--against: {exc}") from None
    index = corpus.manifest.extra.get("signature_index")
    if not isinstance(index, Mapping) or not isinstance(index.get("params"), Mapping):
        raise DedupError(f"--against {url}: the corpus has no signature index (not built by gristmill dedup)")
    theirs = index["params"]
    ours = dataclasses.asdict(params)
    for name in ("num_perm", "ngram", "bands", "rows", "seed"):
        if theirs.get(name) != ours[name]:
            hint = ""
            if name in ("bands", "rows") and bool(theirs.get("verify", False)) != params.verify:
                # the default bands differ with and without verification; the index's own are what matter
                hint = (f" (the index was built {'with' if theirs.get('verify') else 'without'} edge verification: "
                        f"pass --bands {theirs.get('bands')} --rows {theirs.get('rows')}"
                        f"{'' if theirs.get('verify') else ', or --no-verify'})")
            raise DedupError(f"--against {url}: its index was built with {name}={theirs.get(name)}, "
                             f"this job uses {name}={ours[name]}; use the same settings{hint}")
    try:
        files = listed_index_files(corpus)
    except CorpusError as exc:
        raise DedupError(f"--against {url}: {exc}") from None
    protocol = url.split("://", 1)[0] + "://" if "://" in url else ""

    def located(path: str) -> str:
        return path if not protocol or path.startswith(protocol) else protocol + path

    return [IndexFile(located(f.url), located(f.bands_url) if f.bands_url else None) for f in files]


def claim_folders(config: DedupConfig, files: list[InputFile], fingerprint: str) -> Corpus | None:
    """Check the folders before any work (``gristmill.pipeline.job.folders``); the committed corpus if this job finished."""
    # a folder INPUT is walked (and a ** glob's fixed prefix is): nothing may be written inside it
    inputs = [(spec, _walked_folder(spec)) for spec in config.inputs]
    inputs = [(spec, folder) for spec, folder in inputs if folder and _is_folder(folder, config)]
    inputs += [(f.origin, f.url) for f in files]
    # a work folder of its own (not the default, inside the output) keeps out of the others' way too
    work = config.work_dir if config.work_url != config.default_work_url else None
    try:
        for against in config.against or [None]:  # read-only, they may overlap one another
            check_disjoint({"-o": config.output, "--removed": config.removed, "--against": against,
                            "--work-dir": work}, inputs, config.storage_options)
        if work:
            check_work_dir(work, JOB_RECORD, config.storage_options)
        finished = claim(config.output, fingerprint, config.overwrite, "-o", config.storage_options)
        if config.removed:
            claim(config.removed, fingerprint, config.overwrite, "--removed", config.storage_options)
    except FolderError as exc:
        raise DedupError(str(exc)) from None
    return finished


def _walked_folder(spec: str) -> str | None:
    """The folder an INPUT makes the job search: itself, or the part of a ``**`` glob before the pattern."""
    if not any(ch in spec for ch in "*?["):
        return spec
    if "**" not in spec:
        return None
    return spec[: min(spec.index(ch) for ch in "*?[" if ch in spec)].rsplit("/", 1)[0] or "."


def _is_folder(url: str, config: DedupConfig) -> bool:
    fs, root = open_fs(url, config.storage_options)
    return fs.isdir(root)
