"""Imported once by the fork server that crawl partitions fork from (crawlers.partitioned): the
crawler and the public suffix list, loaded here instead of in every partition.
"""

from .crawler import Crawler  # noqa: F401
from .partitions import partition_key

partition_key("http://example.com/")  # loads the bundled public suffix list
