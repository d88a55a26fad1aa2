"""Weight-version segments of a trajectory (interruptible rollouts): which version sampled which tokens.

A rollout worker with `partial_rollouts` on does not wait for in-flight trajectories before loading new
weights: it interrupts their generation at the next token, swaps the weights, and resumes each one from
its prefix. The tokens of one trajectory may then come from several versions. The worker records, per
response token, the version that sampled it (None for environment tokens), and `segments_from_versions`
folds that into `Trajectory.segments`: `(start, end, version)` spans, one per run of sampled tokens of one
version. A trajectory is as stale as its oldest segment (`oldest_version`); a group as its oldest
trajectory (`group_oldest_version`).

Pure functions over plain values; the schema's validator (`schemas._check_segments`) states the invariant.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchr1.core.schemas import Segment, Trajectory, TrajectoryGroup


def segments_from_versions(versions: Sequence[int | None]) -> list[Segment]:
    """Segments of a response whose token i was sampled by `versions[i]` (None: an environment token).

    A segment starts at the first sampled token of a version and ends after the last sampled token before
    another version's; environment tokens between two sampled tokens of one version stay inside its
    segment, those between two versions belong to none. [5, 5, None, 5, 6] → [(0, 4, 5), (4, 5, 6)]."""
    out: list[Segment] = []
    start = last = -1
    current: int | None = None
    for i, v in enumerate(versions):
        if v is None:
            continue
        if v != current:
            if current is not None:
                out.append((start, last + 1, current))
            start, current = i, v
        last = i
    if current is not None:
        out.append((start, last + 1, current))
    return out


def oldest_version(trajectory: Trajectory, default: int) -> int:
    """The oldest weight version that sampled any of the trajectory's tokens; `default` (the group's
    `policy_version`) when it records no segments."""
    return min((v for _, _, v in trajectory.segments), default=default)


def group_oldest_version(group: TrajectoryGroup) -> int:
    """The oldest weight version behind any token of the group: what its staleness is measured by."""
    return min([group.policy_version] + [oldest_version(t, group.policy_version) for t in group.trajectories])


def versions_changed(trajectory: Trajectory) -> int:
    """How many times generation of the trajectory moved to another weight version (segments − 1, or 0)."""
    return max(0, len(trajectory.segments) - 1)
