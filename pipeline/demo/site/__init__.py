"""The demo web bundled with gristmill: five small loopback news sites with realistic duplication.

``content`` renders the pages (no aiohttp); ``server`` serves them on 127.0.0.1. See
docs/DEMO.md for what each site copies from which.
"""
