"""Entry point of the sympy worker process: `python -m agentenv.tasks._mathworker`.

Kept apart from `mathcheck` so that running it does not re-import a module the
package already imported.
"""

from agentenv.tasks.mathcheck import worker_main

if __name__ == "__main__":
    worker_main()
