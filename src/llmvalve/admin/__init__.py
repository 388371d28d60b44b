"""Generated from protos/ (python protos/generate.py)."""
