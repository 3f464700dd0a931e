"""The gpt2 family, whole: hf.py, recipe.py."""
