"""The trajectory page: one self-contained HTML file per evaluation, rendered from the
Jinja2 template `templates/trajectory_page.html.j2`.

At the top the run's settings (the model row names the policy as the user gave it),
the failures by kind (`rllib_ragen.rollout.trajectory_record`: a count and links per kind)
and a summary table (success, failure kind, return, turns and valid-answer ratio per
trajectory; click a heading to sort, or open the page as `page.html#sort=-return`
for a sorted view; a checkbox shows failures only); below, each trajectory as a
collapsible `<details>` block (the first one open; a summary link opens its own) with
its turns: thought, response, actions, reward and the state after. States of an env
with a picture (`envs.board`: FrozenLake, Sokoban) are drawn as a small SVG beside
their text (`rllib_ragen.run.board_drawing`), with the turn's moves as arrows;
other states are text only. `evaluation_page` is the page of an evaluation
(training's periodic one, or `rllib-ragen evaluate`'s) with the run's settings on top.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jinja2

from envs import make_env
from envs.base import FAILURE_KINDS
from envs.board import Board
from rllib_ragen.rollout.prompt.prompt_protocol import parse_answer
from rllib_ragen.rollout.trajectory_record import (
    failure_counts,
    failure_kind,
    response_text,
    state_boards,
    succeeded,
    turn_validity,
)
from rllib_ragen.run.board_drawing import drawing, legend

if TYPE_CHECKING:
    from rllib_ragen.algorithm.starpo import StarPOConfig

# In rllib_ragen/run/templates/ (package data): the markup, style and scripts of the page.
TEMPLATE = "trajectory_page.html.j2"
# (key, heading) of the summary table's columns.
_COLUMNS = (
    ("index", "#"),
    ("seed", "seed"),
    ("success", "success"),
    ("failure", "failure kind"),
    ("return", "return"),
    ("turns", "turns"),
    ("valid", "valid ratio"),
)


def evaluation_page(
    config: StarPOConfig,
    episodes: Iterable[Any],
    *,
    title: str,
    limit: int,
    model: str | None = None,
    **settings: Any,
) -> str:
    """The trajectory page of an evaluation under `config`, with the run's settings on top (the
    config's that shape a rollout, plus `settings`).

    `model` is the model row (default: the config's): what the user named, when the config's
    model is a copy unpacked somewhere temporary.
    """
    budget, protocol = config.turn_budget, config.protocol
    shown = {
        "env": config.env,
        "model": config.llm_module.model if model is None else model,
        "temperature": config.starpo_eval.eval_temperature,
        "max turns": budget.max_turns,
        "actions per turn / trajectory": f"{protocol.max_actions_per_turn} / {budget.max_actions_per_traj}",
        "response length": config.rollout.response_length,
        "think": protocol.think,
        **settings,
    }
    kinds = make_env(config.env, **config.env_config).failure_descriptions()
    return trajectories_html(episodes, title=title, settings=shown, failure_descriptions=kinds, limit=limit)


def trajectories_html(
    episodes: Iterable[Any],
    *,
    title: str,
    settings: Mapping[str, Any] | None = None,
    failure_descriptions: Mapping[str, str] | None = None,
    limit: int = 16,
) -> str:
    """The page of the trajectories in `episodes` (the template `templates/trajectory_page.html.j2`).

    Args:
        episodes: Group episodes (`MultiAgentEpisode`) from `LLMEnvRunner.sample`.
        title: Page heading.
        settings: The run's settings, shown in a table at the top.
        failure_descriptions: {failure kind: description} of the env (`TextEnv.failure_descriptions`;
            default: the kinds every env shares).
        limit: Most trajectories shown in full (the summary lists all of them).
    """
    episodes = list(episodes)  # read twice: the kinds and the trajectories
    trajectories = [
        (group_index, agent, trajectory)
        for group_index, episode in enumerate(episodes)
        for agent, trajectory in episode.agent_episodes.items()
    ]
    kinds = [failure_kind(trajectory) for _, _, trajectory in trajectories]
    counts = failure_counts(episodes)
    # Sorting the summary by kind groups each kind's failures, in the table's order; successes first.
    rank: dict[str | None, int] = {None: -1, **{kind: i for i, kind in enumerate(counts)}}
    shown = [_trajectory(*item, kind=kinds[i]) for i, item in enumerate(trajectories[:limit])]
    return _template().render(
        title=title,
        settings=dict(settings or {}),
        columns=_COLUMNS,
        rows=[
            _summary_row(index, t, kinds[index], rank=rank[kinds[index]], limit=limit)
            for index, (_, _, t) in enumerate(trajectories)
        ],
        wins=sum(succeeded(t) for _, _, t in trajectories),
        limit=limit,
        failures=_failure_table(counts, kinds, failure_descriptions or FAILURE_KINDS, limit=limit),
        trajectories=shown,
        legend=legend() if any(t["initial"]["drawing"] for t in shown) else [],
    )


@functools.cache
def _template() -> jinja2.Template:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("rllib_ragen.run", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    return environment.get_template(TEMPLATE)


def _failure_table(
    counts: Mapping[str, int], kinds: list[str | None], descriptions: Mapping[str, str], *, limit: int
) -> list[dict[str, Any]]:
    """One row per failure kind that occurred: its count, description and the trajectories (linked when shown)."""
    return [
        {
            "kind": kind,
            "description": descriptions.get(kind, kind),
            "count": count,
            "trajectories": [{"index": i, "link": i < limit} for i, k in enumerate(kinds) if k == kind],
        }
        for kind, count in counts.items()
        if count
    ]


def _summary_row(index: int, trajectory: Any, kind: str | None, *, rank: int, limit: int) -> dict[str, Any]:
    """The summary table's row of one trajectory: its cells (sort value, text) in `_COLUMNS` order."""
    validity = turn_validity(trajectory)
    valid = sum(validity) / max(len(validity), 1)
    seed, total = trajectory.get_infos()[0].get("seed"), sum(trajectory.get_rewards())
    cells = (
        (index, str(index)),
        (-1 if seed is None else seed, str(seed)),
        (int(succeeded(trajectory)), "yes" if succeeded(trajectory) else "no"),
        (rank, kind or ""),
        (total, f"{total:.2f}"),
        (len(trajectory), str(len(trajectory))),
        (valid, f"{valid:.2f}"),
    )
    return {
        "success": succeeded(trajectory),
        "cells": [
            {"value": float(value), "text": text, "link": column == 0 and index < limit}
            for column, (value, text) in enumerate(cells)
        ],
    }


def _state(text: str, board: Board | None, previous: Board | None) -> dict[str, Any]:
    """A state's text, with its drawing when its env gives a board (the moves since `previous` as arrows)."""
    if board is None:
        return {"text": text, "drawing": None}
    moves = board.moves[len(previous.moves) :] if previous is not None else board.moves
    return {"text": text, "drawing": drawing(board, moves)}


def _trajectory(group_index: int, agent: str, trajectory: Any, *, kind: str | None) -> dict[str, Any]:
    observations, infos, rewards = trajectory.get_observations(), trajectory.get_infos(), trajectory.get_rewards()
    boards = state_boards(trajectory)
    turns = []
    for t, reward in enumerate(rewards):
        info = infos[t + 1]
        response = response_text(info)
        turns.append(
            {
                "reward": reward,
                "actions": str(info.get("parsed_actions", [])),
                "thought": parse_answer(response, max_actions_per_turn=1, think=True).think,
                "response": response,
                "state": _state(str(observations[t + 1]), boards[t + 1], boards[t]),
            }
        )
    return {
        "group": group_index,
        "agent": agent,
        "seed": infos[0].get("seed"),
        "total": sum(rewards),
        "success": succeeded(trajectory),
        "kind": kind,
        "initial": _state(str(observations[0]), boards[0], None),
        "turns": turns,
    }
