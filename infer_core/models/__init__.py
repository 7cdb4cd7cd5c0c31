"""Model architectures, their configs, and weight loading."""
