"""The compiled tier (placeholder docstring, completed below)."""
