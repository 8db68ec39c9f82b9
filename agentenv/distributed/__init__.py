"""Rollout on a Ray cluster (`rollout.placement: ray`): engines and tools as actors on any node.

- `worker`: a rollout worker, the Ray actor that owns one engine (a `Policy`
  built from the run's policy config), and the weight store the workers pull from;
- `router`: which worker serves a call (sticky by trajectory, else the least loaded);
- `client`: `RayPolicy`, the `Policy` the trainer's processes use: routes
  `generate`, pushes versioned weights, brings restarted workers back;
- `tools`: a tool served by an actor on the node that has its resources, and
  its proxy in the trainer (a dead actor's calls are tool errors);
- `cluster`: joining the cluster and starting the actors from `rollout.ray`;
- `nccl`: the GPU weight path (an NCCL broadcast from the trainer to the workers).

Nothing here is imported by `import agentenv`; `ray` loads when a config asks
for `placement: ray` (`pip install 'agentenv[ray]'`).
"""
