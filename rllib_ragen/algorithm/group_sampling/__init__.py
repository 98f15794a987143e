"""Step 1 of an iteration: where its groups come from (`GroupSampler`, chosen by `make_group_sampler`).

- `protocol.py`: the `GroupSampler` protocol;
- `local.py`: the local `LLMEnvRunner` (num_env_runners=0);
- `remote.py`: N remote runners, each a contiguous run of the seeds;
- `async_sampler.py`: remote runners sampling ahead of the learner (async_rollouts=True);
- `offline.py`: groups from an offline dataset;
- `online.py`: what the three online samplers share: the training-seed cursor (`seed_cursor.py`),
  its checkpoint state and the Parquet recording of rollouts;
- `runner_metrics.py`: the remote runners' metrics merged into one report;
- `factory.py`: which sampler an algorithm uses.
"""
