"""The trajectory page: one self-contained HTML file per evaluation, rendered from the
Jinja2 template `templates/trajectory_page.html.j2`.

At the top the run's settings and a summary table (success, return, turns and
valid-answer ratio per trajectory; click a heading to sort, or open the page
as `page.html#sort=-return` for a sorted view); below, each trajectory as a
collapsible `<details>` block (the first one open; a summary link opens its own) with its turns: thought, response,
actions, reward and the state after. Grid states (Sokoban, FrozenLake) are drawn as
coloured cells beside their text, the colours taken from the meaning of each
symbol in the env's legend (`grid_legend`). `evaluation_page` is the page of an
evaluation (training's periodic one, or `rllib-ragen evaluate`'s) with the run's
settings on top.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2

from envs import make_env
from rllib_ragen.rollout.episode_readers import succeeded, turn_validity
from rllib_ragen.rollout.prompt.answer_parser import parse_answer
from rllib_ragen.rollout.trajectory_record import response_text

# (word in a symbol's meaning, cell colour): the first word found decides, so the
# more specific meanings ("box on a target", "you fell") come before the general ones.
_COLOURS = (
    ("wall", "#4a4a4a"),
    ("box on", "#2e9d4f"),
    ("box", "#b5651d"),
    ("fell", "#d32f2f"),
    ("reached", "#2e9d4f"),
    ("you", "#1e6fd9"),
    ("player", "#1e6fd9"),
    ("target", "#f2c230"),
    ("goal", "#f2c230"),
    ("hole", "#13294b"),
    ("ice", "#d9f1ff"),
    ("floor", "#f1f1f1"),
)
_UNKNOWN_COLOUR = "#c8c8c8"
# In rllib_ragen/run/templates/ (package data): the markup, style and sort script of the page.
TEMPLATE = "trajectory_page.html.j2"
# (key, heading) of the summary table's columns.
_COLUMNS = (
    ("index", "#"),
    ("seed", "seed"),
    ("success", "success"),
    ("return", "return"),
    ("turns", "turns"),
    ("valid", "valid ratio"),
)


def grid_legend(instructions: str) -> dict[str, str]:
    """{symbol: meaning} from the `Symbols: # wall, _ empty floor, ...` line of an
    env's instructions; empty when there is none (envs without a grid)."""
    for line in instructions.splitlines():
        if line.startswith("Symbols:"):
            items = line[len("Symbols:") :].strip().rstrip(".").split(", ")
            return {item[0]: item[1:].strip() for item in items if len(item) > 1}
    return {}


def evaluation_page(config: Any, episodes: Iterable[Any], *, title: str, limit: int, **settings: Any) -> str:
    """The trajectory page of an evaluation under `config` (a `StarPOConfig`), with
    the run's settings on top (the config's that shape a rollout, plus `settings`)."""
    shown = {
        "env": config.env,
        "model": config.llm_model,
        "temperature": config.eval_temperature,
        "max turns": config.max_turns,
        "actions per turn / trajectory": f"{config.max_actions_per_turn} / {config.max_actions_per_traj}",
        "response length": config.response_length,
        "think": config.think,
        **settings,
    }
    legend = grid_legend(make_env(config.env, **config.env_config).instructions)
    return trajectories_html(episodes, title=title, settings=shown, legend=legend, limit=limit)


def cell_colour(meaning: str) -> str:
    """The colour of a grid cell whose symbol means `meaning`."""
    meaning = meaning.lower()
    return next((colour for word, colour in _COLOURS if word in meaning), _UNKNOWN_COLOUR)


def trajectories_html(
    episodes: Iterable[Any],
    *,
    title: str,
    settings: Mapping[str, Any] | None = None,
    legend: Mapping[str, str] | None = None,
    limit: int = 16,
) -> str:
    """The page of the trajectories in `episodes` (the template `templates/trajectory_page.html.j2`).

    Args:
        episodes: Group episodes (`MultiAgentEpisode`) from `LLMEnvRunner.sample`.
        title: Page heading.
        settings: The run's settings, shown in a table at the top.
        legend: {symbol: meaning} of the env's grid (`grid_legend`); None or
            empty shows states as text only.
        limit: Most trajectories shown in full (the summary lists all of them).
    """
    trajectories = [
        (group_index, agent, trajectory)
        for group_index, episode in enumerate(episodes)
        for agent, trajectory in episode.agent_episodes.items()
    ]
    legend = dict(legend or {})
    return _template().render(
        title=title,
        settings=dict(settings or {}),
        columns=_COLUMNS,
        rows=[_summary_row(index, trajectory, limit=limit) for index, (_, _, trajectory) in enumerate(trajectories)],
        wins=sum(succeeded(t) for _, _, t in trajectories),
        limit=limit,
        legend=[{"symbol": s, "meaning": m, "colour": cell_colour(m)} for s, m in legend.items()],
        trajectories=[_trajectory(*item, legend=legend) for item in trajectories[:limit]],
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


def _summary_row(index: int, trajectory: Any, *, limit: int) -> list[dict[str, Any]]:
    """The summary table's cells of one trajectory: (sort value, text), in `_COLUMNS` order."""
    validity = turn_validity(trajectory)
    valid = sum(validity) / max(len(validity), 1)
    seed, total = trajectory.get_infos()[0].get("seed"), sum(trajectory.get_rewards())
    cells = (
        (index, str(index)),
        (-1 if seed is None else seed, str(seed)),
        (int(succeeded(trajectory)), "yes" if succeeded(trajectory) else "no"),
        (total, f"{total:.2f}"),
        (len(trajectory), str(len(trajectory))),
        (valid, f"{valid:.2f}"),
    )
    return [
        {"value": float(value), "text": text, "link": column == 0 and index < limit}
        for column, (value, text) in enumerate(cells)
    ]


def _state(text: str, legend: Mapping[str, str]) -> dict[str, Any]:
    """A state's text, with its grid of cells when every line is a row of legend symbols."""
    rows = text.split("\n")
    is_grid = legend and len(rows) > 1 and len({len(r) for r in rows}) == 1 and set(text) - {"\n"} <= set(legend)
    grid = (
        [[{"symbol": c, "meaning": legend[c], "colour": cell_colour(legend[c])} for c in row] for row in rows]
        if is_grid
        else None
    )
    return {"text": text, "grid": grid}


def _trajectory(group_index: int, agent: str, trajectory: Any, *, legend: Mapping[str, str]) -> dict[str, Any]:
    observations, infos, rewards = trajectory.get_observations(), trajectory.get_infos(), trajectory.get_rewards()
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
                "state": _state(str(observations[t + 1]), legend),
            }
        )
    return {
        "group": group_index,
        "agent": agent,
        "seed": infos[0].get("seed"),
        "total": sum(rewards),
        "success": succeeded(trajectory),
        "initial": _state(str(observations[0]), legend),
        "turns": turns,
    }
