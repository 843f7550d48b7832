"""The dedup service: one index (``core``) with its insert log (``insert_log``), its HTTP front
(``server``), the shards of ``--shards`` (``shards``) with their state on a store (``durable``), and
its clients (``client``).

It reads the signature index through :mod:`gristmill.pipeline.format.signature_index`, never through the batch
job's modules (DESIGN.md, "Who depends on whom").
"""
