"""Keep the inference engine's output off the terminal: it goes to a file in the run folder.

vLLM prints ~140 lines while its engine starts: its logger in this process,
and whatever its engine-core and worker processes write to the stdout and
stderr they inherit (their loggers, progress bars, library warnings, C++
warnings). A run's terminal should show agentenv's own lines, the warnings
that matter and the progress bar, so by default all of that goes to
`<output_dir>/engine.log`; `logging.verbose: true` leaves it on the terminal.

Two routes, because the engine writes by two:
- processes: a child inherits this process's file descriptors 1 and 2 when it
  starts. `capture()` points them (and `sys.stdout`, `sys.stderr`) at the log
  while the engine starts, and back after, so the engine's processes write to
  the log for their whole life;
- this process: vLLM's logger keeps a handler of its own (propagation off);
  after the start it gets the log file as its only handler, until `close()`.
  So do transformers' and accelerate's loggers (at every checkpoint they warn
  that the tied `lm_head.weight` is not saved twice, which is expected), and
  transformers' progress bars are off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from agentenv.errors import ConfigError

__all__ = ["EngineLog"]

# Libraries whose logs stay off the terminal once the engine runs: vLLM's engine client,
# transformers / accelerate, which log and draw progress bars at every checkpoint, and Ray's
# notices to the driver ("A worker died ...", `agentenv.distributed.cluster.NOTICES`).
_ENGINE_LOGGERS = ("vllm", "transformers", "accelerate", "agentenv.ray_notices")


class _EngineLogHandler(logging.StreamHandler[IO[str]]):
    """The handler an `EngineLog` puts on an engine logger (a logger that has one is moved already)."""


class EngineLog:
    """Where an engine's output goes during a run.

    Args:
        path: The log file (appended to); its folder is created. None: the
            terminal, as without this class (verbose).
    """

    def __init__(self, path: Path | None):
        self.path = path
        self._file: IO[str] | None = None
        self._saved: list[tuple[logging.Logger, list[logging.Handler], bool]] = []
        self._bars_disabled = False
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1)

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Inside: this process's stdout and stderr (the file descriptors) write to the log.

        Processes started inside keep writing there after the block. Then the
        engine loggers of this process are moved to the log too.
        """
        if self._file is None:
            yield
            return
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        failed = False
        try:
            os.dup2(self._file.fileno(), 1)
            os.dup2(self._file.fileno(), 2)
            # Python-level writes too, where sys.stdout is not backed by fd 1 (e.g. under pytest).
            with contextlib.redirect_stdout(self._file), contextlib.redirect_stderr(self._file):
                yield
        except ConfigError:  # the user's setting, said in one line: the engine's output has nothing to add
            raise
        except BaseException:
            failed = True
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            if failed:  # the engine's own account of the failure is in the log
                print(f"[agentenv] the engine's output is in {self.path}", file=sys.stderr, flush=True)
        self._move_loggers()

    def _move_loggers(self) -> None:
        assert self._file is not None
        if "transformers" in sys.modules:  # its progress bars (checkpoint writing) draw on the terminal
            from transformers.utils import logging as hf_logging

            if hf_logging.is_progress_bar_enabled():
                hf_logging.disable_progress_bar()
                self._bars_disabled = True
        for name in _ENGINE_LOGGERS:
            logger = logging.getLogger(name)
            if any(isinstance(h, _EngineLogHandler) for h in logger.handlers):
                continue
            self._saved.append((logger, list(logger.handlers), logger.propagate))
            handler = _EngineLogHandler(self._file)
            handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
            logger.handlers = [handler]
            logger.propagate = False

    def close(self) -> None:
        """Give the engine loggers their handlers back and close the file. Idempotent."""
        for logger, handlers, propagate in reversed(self._saved):
            logger.handlers = handlers
            logger.propagate = propagate
        self._saved.clear()
        # A library that set its logging up inside `capture` (vLLM: `ext://sys.stdout`) made its handler write
        # into this file; after the close it writes where that stream goes now, not into a closed file.
        for name in _ENGINE_LOGGERS if self._file is not None else ():
            for h in logging.getLogger(name).handlers:
                if isinstance(h, logging.StreamHandler) and h.stream is self._file:
                    h.setStream(sys.stdout)
        if self._bars_disabled:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()
            self._bars_disabled = False
        if self._file is not None:
            self._file.close()
            self._file = None
