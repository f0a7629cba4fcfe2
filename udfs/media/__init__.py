"""Media I/O for ingest: list inputs, read sidecars, probe, decode, hash and deduplicate.

Modules: `reasons` (quarantine codes), `sidecars` (file conventions), `inputs` (listing),
`decode` (frames + timestamps), `scan` (PyAV decode check), `sequence` (image-sequence folders),
`phash` (perceptual hashes), `dedup` (duplicate detection), `probe` (one verdict per input).
"""

import logging

__all__: list[str] = []

logger = logging.getLogger(__name__)
