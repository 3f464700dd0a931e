"""The smollm3 family, whole: hf.py, recipe.py."""
