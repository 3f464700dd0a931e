"""The ground floor."""
