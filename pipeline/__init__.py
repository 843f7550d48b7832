"""gristmill pipeline."""
