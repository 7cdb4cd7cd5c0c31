"""Tensor parallelism for infer: one model split over N ranks joined by torch.distributed."""
