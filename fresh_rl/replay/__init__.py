"""Replay: jittable segment trees and the (age-decayed) prioritized trajectory buffer."""

from fresh_rl.replay import segment_tree, slot_set
from fresh_rl.replay.buffer import (
    ReplayConfig,
    ReplaySample,
    ReplayState,
    TrajectoryBuffer,
    make_trajectory_buffer,
)
from fresh_rl.replay.priorities import DEFAULT_PRIORITY_EPS, advantage_priority, magnitude_priority

__all__ = [
    "DEFAULT_PRIORITY_EPS",
    "ReplayConfig",
    "ReplaySample",
    "ReplayState",
    "TrajectoryBuffer",
    "advantage_priority",
    "magnitude_priority",
    "make_trajectory_buffer",
    "segment_tree",
    "slot_set",
]
