"""The trajectory page: one self-contained HTML file per evaluation.

At the top the run's settings and a summary table (success, return, turns and
valid-answer ratio per trajectory; click a heading to sort, or open the page
as `page.html#sort=-return` for a sorted view); below, each trajectory as a
collapsible `<details>` block (the first one open; a summary link opens its own) with its turns: thought, response, actions,
reward and the state after. Grid states (Sokoban, FrozenLake) are drawn as
coloured cells beside their text, the colours taken from the meaning of each
symbol in the env's legend (`grid_legend`). `evaluation_page` is the page of an
evaluation (training's periodic one, or `rllib-ragen evaluate`'s) with the run's
settings on top.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

from envs import make_env
from rllib_ragen.episode_keys import RESPONSE_TEXT
from rllib_ragen.rollout.episode_readers import succeeded, turn_validity
from rllib_ragen.rollout.prompt.answer_parser import parse_answer

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
# (key, heading) of the summary table's columns.
_COLUMNS = (
    ("index", "#"),
    ("seed", "seed"),
    ("success", "success"),
    ("return", "return"),
    ("turns", "turns"),
    ("valid", "valid ratio"),
)

_STYLE = """
body{font-family:sans-serif;max-width:72em;margin:auto;padding:0 1em}
pre{background:#f4f4f4;padding:.4em;white-space:pre-wrap;margin:.2em 0}
table.data{border-collapse:collapse}table.data td,table.data th{border:1px solid #ccc;padding:.2em .6em}
#summary th{cursor:pointer;background:#eee}#summary td{text-align:right}
.ok{color:#1b7f3b}.bad{color:#b00}
.turn{border-left:3px solid #ccc;padding-left:.6em;margin:.6em 0}
.state{display:flex;gap:1em;align-items:flex-start}
table.grid{border-collapse:collapse}
table.grid td{width:1.6em;height:1.6em;text-align:center;font-family:monospace;border:1px solid #fff}
details{border:1px solid #ddd;border-radius:4px;margin:.5em 0;padding:.3em .6em}
summary{cursor:pointer;font-weight:bold}
"""

_SORT_SCRIPT = """
const table = document.getElementById('summary');
const heads = [...table.tHead.rows[0].cells];
function sortBy(column, descending) {
  const body = table.tBodies[0];
  const rows = [...body.rows].sort((a, b) => {
    const d = parseFloat(a.cells[column].dataset.v) - parseFloat(b.cells[column].dataset.v);
    return descending ? -d : d;
  });
  rows.forEach(row => body.appendChild(row));
  heads.forEach((h, i) => h.dataset.dir = i === column ? (descending ? 'desc' : 'asc') : '');
}
heads.forEach((h, i) => h.addEventListener('click', () => sortBy(i, h.dataset.dir === 'asc')));
const asked = location.hash.match(/sort=(-?)(\\w+)/);
if (asked) {
  const column = heads.findIndex(h => h.dataset.key === asked[2]);
  if (column >= 0) sortBy(column, asked[1] === '-');
}
// A summary link (#t3) opens the trajectory it points to.
function openTarget() {
  const target = location.hash && document.getElementById(location.hash.slice(1));
  if (target && target.tagName === 'DETAILS') target.open = true;
}
window.addEventListener('hashchange', openTarget);
openTarget();
"""


def grid_legend(instructions: str) -> dict[str, str]:
    """{symbol: meaning} from the `Symbols: # wall, _ empty floor, ...` line of an
    env's instructions; empty when there is none (envs without a grid)."""
    for line in instructions.splitlines():
        if line.startswith("Symbols:"):
            items = line[len("Symbols:") :].strip().rstrip(".").split(", ")
            return {item[0]: item[1:].strip() for item in items if len(item) > 1}
    return {}


def evaluation_page(
    config: Any, episodes: Iterable[Any], *, title: str, limit: int, **settings: Any
) -> str:
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
    return trajectories_html(
        episodes, title=title, settings=shown, legend=legend, limit=limit
    )


def cell_colour(meaning: str) -> str:
    """The colour of a grid cell whose symbol means `meaning`."""
    meaning = meaning.lower()
    return next(
        (colour for word, colour in _COLOURS if word in meaning), _UNKNOWN_COLOUR
    )


def trajectories_html(
    episodes: Iterable[Any],
    *,
    title: str,
    settings: Mapping[str, Any] | None = None,
    legend: Mapping[str, str] | None = None,
    limit: int = 16,
) -> str:
    """The page of the trajectories in `episodes`.

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
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _settings_html(settings or {}),
        _summary_html(trajectories, limit=limit),
        _legend_html(legend),
        *(
            _trajectory_html(index, *item, legend=legend)
            for index, item in enumerate(trajectories[:limit])
        ),
        f"<script>{_SORT_SCRIPT}</script></body></html>",
    ]
    return "\n".join(part for part in parts if part)


def _settings_html(settings: Mapping[str, Any]) -> str:
    if not settings:
        return ""
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
        for k, v in settings.items()
    )
    return f"<h2>Settings</h2><table class='data' id='settings'>{rows}</table>"


def _summary_html(trajectories: list[tuple[int, str, Any]], *, limit: int) -> str:
    heads = "".join(f"<th data-key='{key}'>{name}</th>" for key, name in _COLUMNS)
    rows = []
    for index, (_, _, trajectory) in enumerate(trajectories):
        validity = turn_validity(trajectory)
        values = (
            (
                index,
                f"<a href='#t{index}'>{index}</a>" if index < limit else str(index),
            ),
            (
                trajectory.get_infos()[0].get("seed", -1),
                str(trajectory.get_infos()[0].get("seed")),
            ),
            (int(succeeded(trajectory)), "yes" if succeeded(trajectory) else "no"),
            (sum(trajectory.get_rewards()), f"{sum(trajectory.get_rewards()):.2f}"),
            (len(trajectory), str(len(trajectory))),
            (
                sum(validity) / max(len(validity), 1),
                f"{sum(validity) / max(len(validity), 1):.2f}",
            ),
        )
        rows.append(
            "<tr>"
            + "".join(f"<td data-v='{float(v)}'>{text}</td>" for v, text in values)
            + "</tr>"
        )
    wins = sum(succeeded(t) for _, _, t in trajectories)
    return (
        f"<h2>Summary</h2><p>{len(trajectories)} trajectories, {wins} successful; the first "
        f"{min(limit, len(trajectories))} are shown below. Click a heading to sort.</p>"
        f"<table class='data' id='summary'><thead><tr>{heads}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _legend_html(legend: Mapping[str, str]) -> str:
    if not legend:
        return ""
    cells = "".join(
        f"<tr><td style='background:{cell_colour(meaning)}'>{html.escape(symbol)}</td>"
        f"<td style='border:0;width:auto;text-align:left'>{html.escape(meaning)}</td></tr>"
        for symbol, meaning in legend.items()
    )
    return f"<h2>Legend</h2><table class='grid' id='legend'>{cells}</table>"


def _state_html(text: str, legend: Mapping[str, str]) -> str:
    """The state's text, with its grid drawn beside it when every line is a row of legend symbols."""
    escaped = f"<pre>{html.escape(text)}</pre>"
    rows = text.split("\n")
    is_grid = (
        legend
        and len(rows) > 1
        and len({len(r) for r in rows}) == 1
        and set(text) - {"\n"} <= set(legend)
    )
    if not is_grid:
        return escaped
    grid = "".join(
        "<tr>"
        + "".join(
            f"<td style='background:{cell_colour(legend[c])}' title='{html.escape(legend[c])}'>{html.escape(c)}</td>"
            for c in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<div class='state'><table class='grid'>{grid}</table>{escaped}</div>"


def _trajectory_html(
    index: int,
    group_index: int,
    agent: str,
    trajectory: Any,
    *,
    legend: Mapping[str, str],
) -> str:
    observations, infos, rewards = (
        trajectory.get_observations(),
        trajectory.get_infos(),
        trajectory.get_rewards(),
    )
    status = (
        "<span class='ok'>success</span>"
        if succeeded(trajectory)
        else "<span class='bad'>no success</span>"
    )
    heading = (
        # The first trajectory is open as an example; the rest are collapsed.
        f"<details id='t{index}'{' open' if index == 0 else ''}><summary>#{index}: group {group_index} / "
        f"{html.escape(agent)} "
        f"(seed {infos[0].get('seed')}): return {sum(rewards):.2f}, {len(rewards)} turns, {status}</summary>"
    )
    rows = [heading, f"<b>initial state</b>{_state_html(str(observations[0]), legend)}"]
    for t, reward in enumerate(rewards):
        info = infos[t + 1]
        response = str(info.get(RESPONSE_TEXT, ""))
        # The thought is shown on its own so a reader sees at a glance whether
        # reasoning collapsed while the answers still parse.
        thought = parse_answer(response, max_actions_per_turn=1, think=True).think
        rows.append(
            f"<div class='turn'><b>turn {t + 1}</b> &mdash; reward {reward:.2f}, "
            f"actions {html.escape(str(info.get('parsed_actions', [])))}"
            f"<br><b>thought</b><pre>{html.escape(thought) if thought is not None else '(none)'}</pre>"
            f"<b>response</b><pre>{html.escape(response)}</pre>"
            f"<b>state after</b>{_state_html(str(observations[t + 1]), legend)}</div>"
        )
    rows.append("</details>")
    return "\n".join(rows)
