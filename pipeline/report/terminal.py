"""Text from documents and inputs made safe to print on a terminal.

Why: document text, URLs, domains and reject reasons come from hostile input; printed raw, an escape
sequence (``ESC ]`` ... sets the window title, ``ESC [2J`` clears the screen, a C1 ``CSI``) or a bidi
override acts on the reader's terminal or hides what is printed. Every command prints through
:func:`terminal_safe`: each such character becomes a visible ``\\uXXXX``, which is also a valid JSON
escape, so ``--json`` output stays JSON meaning the same text.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, and the bidi embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character (but tab and newline) and bidi control as ``\\uXXXX``."""
    return _UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
