"""The seq2seq family, whole: recipe.py."""
