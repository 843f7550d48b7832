"""gristmill loaders."""
