"""The gpt_neox family, whole: hf.py, recipe.py."""
