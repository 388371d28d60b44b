"""llmvalve: admission control for LLM inference behind Envoy."""

import os

__version__ = "0.1.0"

# Children (Envoy, the control plane, simulated backends) are started by fork and exec, with a
# parent-death signal set in between (`processes.Proc`). gRPC's fork handlers restart its
# poller in the child, whose descriptors are being closed before the exec: while another
# thread used gRPC, 4 children in 40 aborted there ("epoll_wait error: Bad file descriptor"),
# and a test stack failed to start. Nothing here uses gRPC across a fork, so it registers no
# fork handlers. gRPC reads this when it is first imported; a value already set is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
