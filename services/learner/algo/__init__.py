"""The learner's math, pure: losses and KL estimators, advantages, batch building, the staleness rule,
DAPO's group filters, the training temperature, the reference's EMA, a step's group figures and the
compact encoding of the task ids a checkpoint holds.

Tensors, groups or numbers in, values out: no Redis, no files, no model loading, no logging.
"""
