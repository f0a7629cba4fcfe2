"""Media I/O for ingest: list inputs, read sidecars, probe, decode, hash and deduplicate.

Modules: `reasons` (quarantine codes), `sidecars` (file conventions), `inputs` (listing), `decode`
(frames + timestamps), `forked` (decoder work in a killable child process), `scan` (PyAV decode
check), `sequence` (image-sequence folders), `phash` (perceptual hashes), `dedup` (duplicate
detection), `probe` (one verdict per input), `gpmf` (GoPro GPMF payloads -> sensor blocks),
`gpmf_imu` (-> camera-frame IMU on the video's clock), `imu` (an episode's IMU: sidecar or embedded
track, one reader for ingest and fusion).
"""

import logging

__all__: list[str] = []

logger = logging.getLogger(__name__)
