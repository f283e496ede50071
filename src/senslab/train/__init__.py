"""Training: loop, callbacks, checkpoints, regularization."""
