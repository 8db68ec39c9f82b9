"""Entry point of the verifier worker process: `python -m agentenv.tasks._mathworker` (see `agentenv.tasks.worker`).

Kept apart from `worker` so that running it does not re-import a module the
package already imported. (Named for its first use: sympy's math checks.)
"""

from agentenv.tasks.worker import worker_main

if __name__ == "__main__":
    worker_main()
