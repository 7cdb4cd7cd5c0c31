"""int8 and FP8 W8A8 quantizers for infer (``plugin.py`` registers them)."""
