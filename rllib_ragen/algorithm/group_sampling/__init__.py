"""Step 1 of an iteration: where its groups come from (`GroupSampler`, chosen by `make_group_sampler`).

- `group_sampler.py`: the `GroupSampler` protocol;
- `online_sampler.py`: what the three online samplers share (the training-seed cursor, its checkpoint
  state and the Parquet recording of rollouts), and `LocalSampler`, the local `LLMEnvRunner`
  (num_env_runners=0);
- `remote_sampler.py`: N remote runners, each a contiguous run of the seeds;
- `async_sampler.py`: remote runners sampling ahead of the learner (async_rollouts=True);
- `offline_sampler.py`: groups from an offline dataset;
- `runner_metrics.py`: the remote runners' metrics merged into one report;
- `sampler_factory.py`: which sampler an algorithm uses.
"""
