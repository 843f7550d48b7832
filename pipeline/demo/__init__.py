"""``make demo`` (``python -m gristmill.pipeline.demo``): the whole product on one machine with no network, and
the demo web it crawls (``site``)."""
