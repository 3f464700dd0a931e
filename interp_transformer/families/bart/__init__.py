"""The bart family, whole: hf.py, recipe.py."""
