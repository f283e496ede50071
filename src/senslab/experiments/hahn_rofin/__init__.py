"""Hahn & Rofin, "Why are Sensitive Functions Hard for Transformers?" experiments
(docs/definitions.md#hahn-and-rofin-setup)."""
