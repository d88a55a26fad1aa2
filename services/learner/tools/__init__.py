"""Operator tools around the learner: the trajectory archive and its commands, the delivery audit, and
the dataset tools (`data prepare`, `data fetch`).
"""
