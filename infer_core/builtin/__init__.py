"""The core's own implementation of every extension point, registered like any plugin."""
