"""vLLM engines in Ray actors: the pool, the actor, in-place weight reload."""
