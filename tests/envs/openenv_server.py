"""An OpenEnv server written with openenv-core's own API, run as `python openenv_server.py PORT LOG`.

A word game: the server asks for a word; a step whose message holds the word
"yes" earns 1.0, any other 0.0; the episode is done after 2 steps. Every
session's environment appends `open` / `close` to LOG, so a test can count
sessions left open.
"""

from __future__ import annotations

import sys
import uuid

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


class WordAction(Action):
    message: str


class WordObservation(Observation):
    prompt: str = ""


class WordEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self._log("open")

    def _log(self, what: str) -> None:
        with open(sys.argv[2], "a") as f:
            f.write(what + "\n")

    def reset(self, seed=None, episode_id=None, **kwargs) -> WordObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return WordObservation(prompt="Say a word.", done=False, reward=0.0)

    def step(self, action: WordAction, timeout_s=None, **kwargs) -> WordObservation:
        self._state.step_count += 1
        reward = 1.0 if "yes" in action.message.lower() else 0.0
        done = self._state.step_count >= 2
        return WordObservation(prompt=f"You said {action.message[:40]!r}. Another word.", done=done, reward=reward)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._log("close")


app = create_fastapi_app(WordEnv, WordAction, WordObservation, max_concurrent_envs=64)

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
