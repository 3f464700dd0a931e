"""The bert family, whole: hf.py, recipe.py."""
