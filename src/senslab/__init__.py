"""senslab: measure, track and regularize the sensitivity of neural networks."""

__version__ = "0.1.0"
