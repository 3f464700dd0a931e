"""The gpt_oss family, whole: hf.py, recipe.py, reference.py."""
