"""The gptj family, whole: hf.py, recipe.py."""
