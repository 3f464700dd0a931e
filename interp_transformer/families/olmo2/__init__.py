"""The olmo2 family, whole: hf.py, recipe.py, reference.py."""
