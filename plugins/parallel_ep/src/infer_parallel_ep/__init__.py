"""Expert parallelism for infer: whole experts on each of N ranks, tokens moved to them by all-to-all."""
