"""The bloom family, whole: hf.py, recipe.py."""
