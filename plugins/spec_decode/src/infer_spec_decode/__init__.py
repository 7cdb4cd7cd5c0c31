"""Speculative decoding for infer: draft tokens proposed on the host, verified by the target in one step."""
