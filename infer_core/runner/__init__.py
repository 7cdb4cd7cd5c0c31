"""The model runner: step inputs, KV cache tensors, forward pass and sampling on one rank."""
