"""The canonical adult hand skeleton, and a model's hand pose carried over onto it.

The skeleton is the 21 MediaPipe keypoints joined by 20 bones (`BONES`: the wrist to each finger's
base, then along each finger). Its dimensions are those of an adult hand 0.19 m long (wrist to the
middle fingertip; mean wrist -> finger-base distance 0.090 m, the fit's hand-size prior): palm positions
of the finger bases, phalanx lengths (proximal, middle, distal) and the thumb's metacarpal and
phalanges, in proportions of the hand's anatomy (the thumb metacarpal is about as long as the index
finger's proximal phalanx, the distal phalanges about half of it). The synthetic hands of
`pose_core.synth` are drawn with it.

Why a fit needs it: the hand model's own 3-D keypoints (MediaPipe's world landmarks) have a palm
long for their fingers (middle finger length / palm length 0.99; 1.04 here, 1.26 on the real photos
with 3-D ground truth of `bench/hands.py`). Posed rigidly onto the 2-D keypoints, such a shape tilts
to make up for it: on those photos its depth came out 4 % too near (median) although the prior hand
is 10 % larger than theirs, i.e. about 13 % of bias from the shape alone.
`retarget` keeps the model's articulation (the direction of each bone) and gives every bone its
length from this skeleton, so all frames of a hand also share one size and one set of proportions.

Convention: palm frame axes (fwd, thumb, back): `fwd` from the wrist towards the middle finger,
`thumb` towards the thumb side in the palm plane, `back` out of the back of the hand; metres.
"""

from __future__ import annotations

import logging

import numpy as np

from pose_core.errors import ShapeError

__all__ = [
    "BONES",
    "FINGER_LENGTHS_M",
    "FINGER_MCP_M",
    "THUMB_CMC_M",
    "THUMB_LENGTHS_M",
    "bone_lengths",
    "canonical_palm_size",
    "retarget",
]

logger = logging.getLogger(__name__)

# Bones as (parent, child) keypoint indices in MediaPipe order, thumb first, each finger from the wrist.
BONES: tuple[tuple[int, int], ...] = tuple(
    (0 if j == 0 else base + j - 1, base + j) for base in (1, 5, 9, 13, 17) for j in range(4)
)
# Finger bases (index, middle, ring, pinky MCP) in the palm frame (fwd, thumb), metres.
FINGER_MCP_M = np.array([[0.090, 0.024], [0.093, 0.004], [0.088, -0.015], [0.080, -0.032]])
# Phalanx lengths (proximal, middle, distal to the tip) of index, middle, ring, pinky, metres.
FINGER_LENGTHS_M = np.array(
    [[0.043, 0.025, 0.020], [0.047, 0.028, 0.022], [0.044, 0.027, 0.021], [0.035, 0.020, 0.019]]
)
# Thumb CMC in the palm frame (fwd, thumb, back), metres.
THUMB_CMC_M = np.array([0.025, 0.022, -0.012])
# Thumb metacarpal, proximal and distal phalanx (to the tip) lengths, metres.
THUMB_LENGTHS_M = np.array([0.045, 0.032, 0.026])


def bone_lengths() -> np.ndarray:
    """Length of each bone of `BONES` in the canonical skeleton, metres, `(20,)`."""
    thumb = [float(np.linalg.norm(THUMB_CMC_M)), *THUMB_LENGTHS_M]
    pairs = zip(FINGER_MCP_M, FINGER_LENGTHS_M, strict=True)
    fingers = [[float(np.linalg.norm(mcp)), *lengths] for mcp, lengths in pairs]
    return np.array([thumb, *fingers]).ravel()


def canonical_palm_size() -> float:
    """Mean wrist -> finger-base distance of the canonical skeleton, metres (0.0904)."""
    return float(np.linalg.norm(FINGER_MCP_M, axis=1).mean())


def retarget(shape: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A hand pose carried over onto a skeleton: every bone keeps its direction and gets its length.

    Args:
        shape: 3-D keypoints of a hand in any frame and unit, `(21, 3)`.
        lengths: bone lengths in `BONES` order, `(20,)` (e.g. `bone_lengths()` scaled).

    Returns:
        Keypoints `(21, 3)` in the frame of `shape`, wrist at its wrist, in the unit of `lengths`; a
        bone of zero length in `shape` keeps its parent's position.

    Raises:
        ShapeError: `shape` is not `(21, 3)` or `lengths` not `(20,)`.

    Example:
        >>> pose = retarget(np.random.default_rng(0).normal(size=(21, 3)), bone_lengths())
        >>> round(float(np.linalg.norm(pose[12] - pose[11])), 3)
        0.022
    """
    if shape.shape != (21, 3) or lengths.shape != (len(BONES),):
        raise ShapeError("shape / lengths", (shape.shape, lengths.shape), "(21, 3) and (20,)")
    out = np.zeros((21, 3))
    out[0] = shape[0]
    for (parent, child), length in zip(BONES, lengths, strict=True):
        step = shape[child] - shape[parent]
        norm = np.linalg.norm(step)
        out[child] = out[parent] + (length * step / norm if norm > 0 else 0.0)
    return out
