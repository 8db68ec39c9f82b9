"""The embedded default model: a small Qwen2 built offline and given a cold-start SFT.

`ensure_tiny_model()` builds it once (tokenizer trained with `tokenizers` on the
toy tasks' text, SFT on synthetic traces of correct tool use made through the
real env and tools, plus a share of arithmetic traces that skip the tool and
answer with a head estimate, so the cold-start model sometimes fails to call
python where it must: what RL is to fix) and caches it under `$AGENTENV_CACHE/tiny/<key>/`
(default `~/.cache/agentenv`). The folder loads with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` and is
servable by vLLM. `python -m agentenv.toy.tiny` runs the build.
"""

from __future__ import annotations

from agentenv.toy.tiny.build import build_tiny_model, ensure_tiny_model, load_tiny_tokenizer, tiny_dir
from agentenv.toy.tiny.config import TinyBuildConfig, cache_root

__all__ = [
    "TinyBuildConfig",
    "build_tiny_model",
    "cache_root",
    "ensure_tiny_model",
    "load_tiny_tokenizer",
    "tiny_dir",
]
