"""Where the learner loop gets each step's groups: `GroupSource` (`base.py`), the trajectories stream
(`stream.py`: reading, filtering, setting aside, dead-lettering, DAPO dynamic sampling) and a trajectory
archive (`archive.py`, for `searchr1 train --replay`).
"""
