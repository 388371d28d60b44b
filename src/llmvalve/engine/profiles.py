"""Engine profiles: the numbers that make a simulated engine behave like a GPU and a model.

Step time model (one continuous-batching iteration, as vLLM v1 runs it):
    t = base_s + per_seq_s · seqs + per_prefill_token_s · prefill_tokens
        + per_ctx_token_s · context + per_request_s · new_requests
where `seqs` is the number of requests in the batch, `prefill_tokens` the prompt (or recompute)
tokens computed in this step, `context` the KV tokens the batch attends over, and
`new_requests` the requests scheduled for the first time in it. Sources for the
calibrated profile are in docs/engine.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineProfile:
    name: str
    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    base_s: float
    per_seq_s: float
    per_prefill_token_s: float
    per_ctx_token_s: float
    # Per-request fixed cost, paid in the step a request is first scheduled (tokenising,
    # setting up its state, detokenising and streaming), serialised with the forward pass.
    per_request_s: float = 0.0
    model: str = "sim-model"
    # Output-length model for the HTTP backend when a request does not say how long it is:
    # the answer is `default_output_tokens` long, capped by max_tokens.
    default_output_tokens: int = 128
    # vLLM's `--scheduling-policy`: "fcfs" (its default) or "priority" (waiting requests by
    # (priority, arrival), the lowest priority preempted first; a request's priority is the
    # `priority` field of its body, lower first).
    scheduling_policy: str = "fcfs"

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def startup_error(self) -> str | None:
        """Why vLLM would not start with these settings (a KV cache that holds less than one
        sequence of max_model_len: no request of the longest length could ever run); None
        when it would."""
        if self.kv_capacity_tokens >= self.max_model_len:
            return None
        return (f"{self.num_gpu_blocks} blocks of {self.block_size} tokens hold less than one "
                f"sequence of max_model_len {self.max_model_len} (vLLM would not start)")


# Llama-3-8B-Instruct, bf16, one H100 80GB SXM, vLLM defaults. The step-time terms are fitted to
# published vLLM measurements (`python -m llmvalve.engine.calibrate`; sources in docs/engine.md).
LLAMA3_8B_H100 = EngineProfile(
    name="llama3-8b-h100",
    model="meta-llama/Meta-Llama-3-8B-Instruct",
    num_gpu_blocks=27_648,  # ≈ 54 GiB of KV at 128 KiB/token = 442,368 tokens
    block_size=16,
    max_num_seqs=1024,  # vLLM's default for the OpenAI server on an H100
    max_num_batched_tokens=8192,
    max_model_len=8192,
    base_s=0.0072,  # fitted; weight streaming alone is 16 GB / 3.35 TB/s = 4.8 ms
    per_seq_s=0.000030,  # fitted
    per_prefill_token_s=0.000034,  # fitted: ≈ 29k prompt tokens/s, ~48 % of bf16 peak
    per_ctx_token_s=0.000_000_050,  # KV read: 128 KiB/token at ~78 % of 3.35 TB/s
    per_request_s=0.0008,  # fitted
)

# A deliberately small engine: easy to overload, cheap to run over HTTP on a 2-core machine.
SMALL = EngineProfile(
    name="small",
    model="sim-small",
    num_gpu_blocks=1024,  # 16,384 KV tokens
    block_size=16,
    max_num_seqs=32,
    max_num_batched_tokens=2048,
    max_model_len=8192,
    base_s=0.020,
    per_seq_s=0.0008,
    per_prefill_token_s=0.0001,  # 10k prompt tokens/s
    per_ctx_token_s=0.000_001,
    per_request_s=0.0022,  # scaled like base_s: 0.8 ms × 20 / 7.2
)

# Four times the small engine's KV cache and batch: long prompts (4k tokens) fit a dozen at a
# time, so admission is not decided by the granularity of three requests per engine.
MEDIUM = EngineProfile(
    name="medium",
    model="sim-medium",
    num_gpu_blocks=4096,  # 65,536 KV tokens
    block_size=16,
    max_num_seqs=64,
    max_num_batched_tokens=4096,
    max_model_len=16384,
    base_s=0.020,
    per_seq_s=0.0004,
    per_prefill_token_s=0.00005,  # 20k prompt tokens/s
    per_ctx_token_s=0.000_000_25,
    per_request_s=0.0022,  # scaled like base_s
)

# Tiny and quick, for end-to-end tests that need answers in a fraction of a second.
TINY = EngineProfile(
    name="tiny",
    model="sim-tiny",
    num_gpu_blocks=256,  # 4,096 KV tokens
    block_size=16,
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    max_model_len=4096,
    base_s=0.010,
    per_seq_s=0.0005,
    per_prefill_token_s=0.00005,
    per_ctx_token_s=0.000_001,
    per_request_s=0.0011,  # scaled like base_s
    default_output_tokens=16,
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (LLAMA3_8B_H100, SMALL, MEDIUM, TINY)}


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(PROFILES)}") from None
