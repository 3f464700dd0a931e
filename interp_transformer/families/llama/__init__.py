"""The llama family, whole: hf.py, recipe.py, reference.py."""
