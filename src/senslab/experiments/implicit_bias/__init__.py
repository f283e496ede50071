"""Vasudeva, Deora & Thrampoulidis: implicit bias and fast convergence of self-attention."""
