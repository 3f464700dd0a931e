"""Circuits as matrices: ``FactoredMatrix`` (``QK``/``OV`` without forming them) and its spectra."""
