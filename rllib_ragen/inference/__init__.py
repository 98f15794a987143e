"""Rollout engines (in-process HF, vLLM actor pool) and the learner -> engine weight sync."""
