"""The prompt protocol: chat template, prompts, answer parsing, token histories (token-in/token-out)."""
