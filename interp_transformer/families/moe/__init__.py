"""The moe family, whole: hf.py, recipe.py, reference.py."""
