"""The gemma family, whole: hf.py, recipe.py, reference.py."""
