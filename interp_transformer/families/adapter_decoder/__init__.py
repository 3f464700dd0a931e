"""The adapter_decoder family, whole: recipe.py."""
