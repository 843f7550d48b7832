"""The one exception of the corpus format, in a module of its own so every format module can raise it."""


class CorpusError(Exception):
    """A corpus cannot be read or written as asked; the message names the file."""
