"""Sequence-parallel attention (USP): Ulysses all-to-all x Ring K/V passing, with pluggable kernels."""
