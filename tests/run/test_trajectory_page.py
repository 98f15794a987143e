"""The trajectory page: summary table, settings, grids as coloured cells and
collapsible trajectories, checked as markup and in a real headless Chromium."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from envs import make_env
from rllib_ragen.rollout.trajectory_record import TurnRecord, turn_info
from rllib_ragen.run.trajectory_page import cell_colour, grid_legend, trajectories_html

SOKOBAN_LEGEND = grid_legend(make_env("sokoban").instructions)
# .ci/run sets this: there a missing Chromium is a failure, not a skip.
REQUIRE_CHROMIUM = os.environ.get("RLLIB_RAGEN_REQUIRE_CHROMIUM") == "1"


def _episode(
    seed: int, rewards: list[float], *, success: bool, valid: list[int]
) -> MultiAgentEpisode:
    """One trajectory on a 3x4 Sokoban-like grid, one turn per reward."""
    states = ["####\n#PX#\n####", "####\n#_P#\n####"]
    episode = MultiAgentEpisode()
    episode.add_env_reset(
        observations={"traj_0": states[0]}, infos={"traj_0": {"seed": seed}}
    )
    for turn, (reward, valid_actions) in enumerate(zip(rewards, valid)):
        last = turn == len(rewards) - 1
        info = {
            **turn_info(TurnRecord([], [], [], f"<think>push {seed}</think><answer>Right</answer>")),
            "parsed_actions": ["Right"],
            "num_valid_actions": valid_actions,
            "success": success and last,
        }
        episode.add_env_step(
            observations={"traj_0": states[(turn + 1) % 2]},
            actions={"traj_0": np.array([5, 6])},
            rewards={"traj_0": reward},
            infos={"traj_0": info},
            terminateds={"traj_0": last, "__all__": last},
            truncateds={"traj_0": False, "__all__": False},
        )
    return episode


EPISODES = [
    _episode(123, [0.5, -0.1], success=False, valid=[1, 0]),
    _episode(124, [2.0], success=True, valid=[1]),
    _episode(125, [-1.0, -1.0, 0.25], success=False, valid=[0, 0, 1]),
]


def test_legend_is_read_from_the_env_instructions_and_coloured_by_meaning():
    assert SOKOBAN_LEGEND == {
        "#": "wall",
        "_": "empty floor",
        "O": "target",
        "X": "box",
        "√": "box on a target",
        "P": "you (the player)",
        "S": "you standing on a target",
    }
    lake = grid_legend(make_env("frozenlake").instructions)
    assert (lake["O"], lake["X"]) == ("hole", "you fell into a hole")
    # The same symbol gets the colour of its meaning in each env.
    assert (
        cell_colour(SOKOBAN_LEGEND["O"])
        == cell_colour(lake["G"])
        != cell_colour(lake["O"])
    )
    assert cell_colour(SOKOBAN_LEGEND["√"]) != cell_colour(SOKOBAN_LEGEND["X"])
    assert cell_colour(SOKOBAN_LEGEND["S"]) == cell_colour(SOKOBAN_LEGEND["P"])
    assert grid_legend(make_env("bandit").instructions) == {}


def test_page_markup_escapes_text_and_draws_only_grids():
    page = trajectories_html(
        EPISODES[:1],
        title="eval <1>",
        settings={"env": "sokoban"},
        legend=SOKOBAN_LEGEND,
    )
    assert "<h1>eval &lt;1&gt;</h1>" in page and "<th>env</th><td>sokoban</td>" in page
    assert "<b>thought</b><pre>push 123</pre>" in page
    # Quotes are escaped too (as whichever character reference the template engine writes).
    assert "reward 0.50, actions ['Right']" in html.unescape(page) and "['Right']" not in page
    assert "<pre>####\n#PX#\n####</pre>" in page
    # Without a legend (or for text that is no grid) states are text only.
    plain = trajectories_html(EPISODES[:1], title="t")
    assert "class='grid'" not in plain and "<pre>####\n#PX#\n####</pre>" in plain


class _Dom(HTMLParser):
    """The parts of a rendered DOM the browser test looks at."""

    def __init__(self) -> None:
        super().__init__()
        self.summary_rows: list[list[str]] = []
        self.grid_cells: list[
            tuple[str, str]
        ] = []  # (symbol, background) of the trajectories' grids
        self.details = 0
        self._in, self._cell, self._style = None, None, ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._in = attrs.get("id") or attrs.get("class")
        elif tag == "tr" and self._in == "summary":
            self.summary_rows.append([])
        elif tag == "td":
            self._cell, self._style = "", attrs.get("style", "")
        elif tag == "details":
            self.details += 1

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            if self._in == "summary":
                self.summary_rows[-1].append(self._cell)
            elif self._in == "grid":
                self.grid_cells.append((self._cell, self._style))
            self._cell = None
        elif tag == "table":
            self._in = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if REQUIRE_CHROMIUM:
            pytest.fail(
                "RLLIB_RAGEN_REQUIRE_CHROMIUM=1 but chromium is not on PATH (.ci/run installs it)"
            )
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
        )
    return found


def _dump_dom(chromium: str, url: str, profile) -> str:
    """The DOM of `url` after its scripts ran, as headless Chromium serialises it."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--dump-dom",
        url,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=True
    ).stdout


def test_page_renders_in_headless_chromium_sorted_with_coloured_grids(tmp_path):
    chromium = _chromium()
    page = tmp_path / "page.html"
    page.write_text(
        trajectories_html(
            EPISODES, title="eval", settings={"env": "sokoban"}, legend=SOKOBAN_LEGEND
        )
    )
    dom = _dump_dom(chromium, f"{page.as_uri()}#sort=-return", tmp_path / "profile")
    parsed = _Dom()
    parsed.feed(dom)

    header, *rows = parsed.summary_rows
    assert header == []  # the heading row holds <th> cells
    # Sorted by return, highest first, by the page's own script (#sort=-return).
    assert [row[1] for row in rows] == ["124", "123", "125"]
    assert rows == [
        ["1", "124", "yes", "2.00", "1", "1.00"],
        ["0", "123", "no", "0.40", "2", "0.50"],
        ["2", "125", "no", "-1.75", "3", "0.33"],
    ]
    # Collapsible; only the first is open, and the one a link's #t2 names is opened too.
    opened = re.compile(r'<details id="(t\d)" open')
    assert parsed.details == 3 and opened.findall(dom) == ["t0"]
    linked = _dump_dom(chromium, f"{page.as_uri()}#t2", tmp_path / "profile")
    assert opened.findall(linked) == ["t0", "t2"]
    # Every state (initial + one per turn) is drawn as 3 x 4 cells coloured by their symbol's meaning.
    states = sum(len(e.agent_episodes["traj_0"]) + 1 for e in EPISODES)
    assert len(parsed.grid_cells) == states * 12
    assert ("X", f"background:{cell_colour('box')}") in parsed.grid_cells
    assert ("#", f"background:{cell_colour('wall')}") in parsed.grid_cells
    assert {style for symbol, style in parsed.grid_cells if symbol == "P"} == {
        f"background:{cell_colour('you')}"
    }
