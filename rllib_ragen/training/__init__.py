"""Steps 2-4 of an iteration, the update: group filter, RL module, learner connector pieces, advantages, losses,
learner."""
