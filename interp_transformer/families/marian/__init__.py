"""The marian family, whole: hf.py, recipe.py."""
