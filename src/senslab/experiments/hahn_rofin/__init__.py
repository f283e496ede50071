"""Hahn & Rofin, "Why are Sensitive Functions Hard for Transformers?" (SPEC §6) experiments."""
