"""gristmill crawlers."""
