"""Step 1 of an iteration, sampling: the LLM env runner, env groups, async rollouts, fixed-seed evaluation."""
