"""Hand identity names: the values of the hand tables' ``identity`` column, defined once.

The wearer's two hands are ``wearer_left`` and ``wearer_right``; another person's hands are
``other_<n>``, numbered in order of appearance (`pose_core.hands.wearer` decides which is which).
"""

from __future__ import annotations

__all__ = ["WEARER_HANDS", "WEARER_LEFT", "WEARER_RIGHT", "bystander_hand", "is_right_hand", "is_wearer",
           "wearer_hand"]

WEARER_LEFT = "wearer_left"
WEARER_RIGHT = "wearer_right"
WEARER_HANDS: tuple[str, str] = (WEARER_LEFT, WEARER_RIGHT)  # the order of every per-hand array axis


def wearer_hand(side: str) -> str:
    """The wearer's hand on ``side`` ("left" or "right")."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    return f"wearer_{side}"


def bystander_hand(n: int) -> str:
    """The ``n``-th other person's hand to appear."""
    return f"other_{n}"


def is_wearer(identity: str) -> bool:
    """True for the wearer's hands."""
    return identity in WEARER_HANDS


def is_right_hand(identity: str) -> bool:
    """True for the wearer's right hand (the only identity with a known side besides the left)."""
    return identity == WEARER_RIGHT
