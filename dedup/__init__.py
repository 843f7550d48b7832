"""gristmill dedup."""
