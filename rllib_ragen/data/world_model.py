"""A world model's data: from played trajectories, the true next state after each turn's moves.

SPA (arXiv 2510.15047) first teaches a small model the env's dynamics (to state the next
state after a move) and then runs RL, and reports that RL gains more after it. Here that
stage is auxiliary supervised data beside the warm start's demonstrations: each answered
turn of a demonstration becomes one prompt, the state the turn saw and the moves it made,
whose target is the state the env returned, in the env's own words. The prompt keeps the
agent's system block (the task's instructions), so the dynamics are learnt in the context
the policy later plays in. Nothing here reaches a rollout or an evaluation: they only ever
show the model the env's true states.
"""

from __future__ import annotations

from collections.abc import Sequence

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from rllib_ragen.rollout.prompt.prompt_protocol import ACTION_SEPARATOR, PromptProtocol
from rllib_ragen.rollout.prompt.token_history import TokenHistory
from rllib_ragen.rollout.trajectory_record import Trajectory

# Where the parsed moves of an answered turn are in its step info (`demonstrations._play`).
PARSED_ACTIONS = "parsed_actions"


def transition_question(state: str, actions: Sequence[str]) -> str:
    """The user message of one transition: the state, the moves, and what to write."""
    moves = f" {ACTION_SEPARATOR} ".join(actions)
    return f"State:\n{state}\nMoves: {moves}\nWrite the state after these moves."


def transition_trajectories(episodes: Sequence[MultiAgentEpisode], protocol: PromptProtocol) -> list[Trajectory]:
    """One single-turn trajectory per answered turn of `episodes`: (state, moves) -> the next state.

    Each is one token row (system | user | next state + end of turn), its only
    trained tokens the next state's; a turn whose answer parsed to no move is
    left out (the env did not move). Rewards are 0: behaviour cloning reads none.
    """
    template = protocol.template
    out: list[Trajectory] = []
    for episode in episodes:
        for agent_episode in episode.agent_episodes.values():
            states, infos = agent_episode.get_observations(), agent_episode.get_infos()
            for turn in range(len(agent_episode)):
                actions = list(infos[turn + 1].get(PARSED_ACTIONS, ()))
                if not actions:
                    continue
                response = [*template.encode(str(states[turn + 1])), template.eos_token_id]
                history = TokenHistory(list(protocol.system_ids), history_window=0)
                history.add_user(template.user_ids(transition_question(str(states[turn]), actions)))
                history.add_response(response, [0.0] * len(response), template.close_ids(response))
                out.append(Trajectory(history, [0.0], group_id=len(out)))
    return out
