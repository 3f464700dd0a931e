"""The opt family, whole: hf.py, recipe.py."""
