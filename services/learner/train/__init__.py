"""The learner's training runtime: model loading, optimizers, the training step (pre-pass, KL term,
trainer), checkpoints and the data-parallel plumbing. No Redis; no stream bookkeeping.
"""
