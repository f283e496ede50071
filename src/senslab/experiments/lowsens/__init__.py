"""Experiments of "Transformers Learn Low Sensitivity Functions" (ICLR 2025) on small models."""
