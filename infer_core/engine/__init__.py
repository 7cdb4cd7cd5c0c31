"""The engine: requests in, one scheduled step at a time, incremental outputs out."""
