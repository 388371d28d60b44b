"""`llmvalve override`: hold a pool at a fixed limit for a while, or clear it (admin gRPC)."""

from llmvalve.top import add_override_arguments as add_arguments
from llmvalve.top import run_override as run

__all__ = ["add_arguments", "run"]
