"""The phi3 family, whole: hf.py, recipe.py."""
