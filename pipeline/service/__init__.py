"""The dedup service: the online signature index and its HTTP front (``server``), and its clients (``client``).

It reads the signature index through :mod:`gristmill.pipeline.format.signature_index`, never through the batch
job's modules (DESIGN.md, "Who depends on whom").
"""
