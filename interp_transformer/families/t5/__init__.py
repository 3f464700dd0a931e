"""The t5 family, whole: hf.py, recipe.py."""
