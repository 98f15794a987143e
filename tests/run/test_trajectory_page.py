"""The trajectory page: settings, failures by kind, summary, boards drawn as SVG from the env's
own state, checked as markup and in a real headless Chromium (DOM after the page's scripts ran,
and screenshots of a FrozenLake and a Sokoban page)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image
from scripted_episodes import LAKE_ENV, ROOM_ENV, scripted_episode

from envs import make_env
from rllib_ragen.algorithm.presets import preset
from rllib_ragen.run.board_drawing import legend
from rllib_ragen.run.trajectory_page import evaluation_page, trajectories_html

# .ci/run sets this: there a missing Chromium is a failure, not a skip.
REQUIRE_CHROMIUM = os.environ.get("RLLIB_RAGEN_REQUIRE_CHROMIUM") == "1"
COLOURS = {item["meaning"]: item["colour"] for item in legend()}

# (answers, max turns) of hand-made trajectories on the hand-made lake and room (tests/scripted_episodes.py).
LAKE_PLAYS = [
    ([["Right", "Right"]], 5),  # into the hole
    ([["Down", "Right"], ["Right", "Down"]], 5),  # to the goal
    ([["Down"], ["Up", "Up"], ["Left"]], 3),  # stuck against the top and left edges
    ([["Down"], ["Jump"]], 2),  # an invalid answer
]
ROOM_PLAYS = [
    ([["Up", "Up", "Right"], ["Up", "Right", "Down"]], 5),  # solved
    ([["Right", "Up", "Up"]], 1),  # the box pushed against the top wall
    ([["Left", "Left"]], 1),  # into the left wall twice
]


def _episodes(env: str, plays, **env_config) -> list:
    return [scripted_episode(env, answers, max_turns=turns, env_config=env_config) for answers, turns in plays]


def _page(env: str, plays, *, model: str, **env_config) -> str:
    """The page `rllib-ragen evaluate` writes, for hand-made trajectories on `env` with the CPU preset's render."""
    config = preset("cpu", "frozenlake" if env == LAKE_ENV else "sokoban")
    config.environment(env, env_config={**config.env_config, **env_config})
    # As `rllib-ragen evaluate` has it: the config names the policy's temporary copy, the model row what the user gave.
    with tempfile.TemporaryDirectory(prefix="evaluate-") as scratch:
        config.llm(model=str(Path(scratch) / "policy"))
        return evaluation_page(
            config, _episodes(env, plays, **config.env_config), title=f"{env} page", limit=8, model=model
        )


def test_page_shows_settings_failures_by_kind_and_escaped_text():
    page = trajectories_html(
        _episodes(LAKE_ENV, LAKE_PLAYS),
        title="eval <1>",
        settings={"env": "lake"},
        failure_descriptions=make_env(LAKE_ENV).failure_descriptions(),
    )
    assert "<h1>eval &lt;1&gt;</h1>" in page and "<th>env</th><td>lake</td>" in page
    assert "<b>thought</b><pre>try Right Right</pre>" in page
    # Quotes are escaped too (as whichever character reference the template engine writes).
    assert "actions ['Right', 'Right']" in html.unescape(page) and "['Right'" not in page
    failures = re.findall(r"<tr data-kind='(\w+)'><td>\w+</td><td>(\d)</td><td>([^<]*)</td><td>(.*?)</td></tr>", page)
    assert failures == [
        ("hole", "1", "fell into a hole", "<a href='#t0'>0</a>"),
        ("invalid_answer", "1", "invalid answer: the last answer held no valid action", "<a href='#t3'>3</a>"),
        (
            "repeated_no_op",
            "1",
            "stuck against an edge: the last moves (two or more) walked into the lake&#39;s edge",
            "<a href='#t2'>2</a>",
        ),
    ]
    # One board per state (the initial one and one per turn); the text stays beside it.
    states = sum(len(e.agent_episodes["traj_0"]) + 1 for e in _episodes(LAKE_ENV, LAKE_PLAYS))
    assert page.count("<svg class='board'") == states
    assert "<pre>P_O\n___\nO_G</pre>" in page


def test_a_turn_whose_answer_ran_no_action_shows_the_board_unchanged():
    page = trajectories_html(_episodes(ROOM_ENV, [([["Right"], []], 2)]), title="room")
    boards = re.findall(r"<svg class='board'.*?</svg>", page, flags=re.S)
    # The turn's move drawn after turn 1; after turn 2 the same state, without arrows.
    assert len(boards) == 3 and "<g class='move'" in boards[1]
    assert boards[2] == re.sub(r"<g class='move'.*?</g>", "", boards[1])


def test_states_of_an_env_without_a_picture_stay_text_only():
    page = trajectories_html(_episodes("bandit", [([["phoenix"]], 1)]), title="bandit")
    assert "<svg" not in page and "Boards, drawn" not in page
    assert "<details id='t0'" in page


class _Dom(HTMLParser):
    """The parts of a rendered DOM the browser tests look at."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[list[str], bool, bool]] = []  # (cells, successful, hidden) of the summary
        self.details: list[tuple[bool, bool]] = []  # (successful, hidden) of the trajectories
        self.settings: dict[str, str] = {}
        self.boards = 0
        self.players: list[str] = []
        self._table, self._cell, self._key = None, None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        hidden, success = "hidden" in attrs, attrs.get("data-success") == "1"
        if tag == "table":
            self._table = attrs.get("id")
        elif tag == "tr" and self._table == "summary" and "data-success" in attrs:
            self.rows.append(([], success, hidden))
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "details":
            self.details.append((success, hidden))
        elif tag == "svg" and attrs.get("class") == "board":
            self.boards += 1
        elif tag == "circle" and attrs.get("class") == "player":
            self.players.append(attrs["fill"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            if self._table == "summary" and tag == "td":
                self.rows[-1][0].append(self._cell)
            elif self._table == "settings":
                if tag == "th":
                    self._key = self._cell
                else:
                    self.settings[self._key] = self._cell
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if REQUIRE_CHROMIUM:
            pytest.fail("RLLIB_RAGEN_REQUIRE_CHROMIUM=1 but chromium is not on PATH (.ci/run installs it)")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def _headless(chromium: str, profile: Path, *args: str) -> str:
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def _dump_dom(chromium: str, url: str, profile: Path) -> str:
    """The DOM of `url` after its scripts ran, as headless Chromium serialises it."""
    return _headless(chromium, profile, "--dump-dom", url)


def _screenshot(chromium: str, page: Path, png: Path) -> Image.Image:
    _headless(
        chromium,
        page.parent / "profile",
        "--hide-scrollbars",
        "--window-size=1000,1400",
        f"--screenshot={png}",
        page.as_uri(),
    )
    return Image.open(png).convert("RGB")


def _pixels_of(image: Image.Image, colour: str) -> int:
    wanted = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return sum(count for count, rgb in image.getcolors(maxcolors=1 << 20) if rgb == wanted)


@pytest.mark.parametrize(
    "env,plays,marks",
    [(LAKE_ENV, LAKE_PLAYS, ("you", "hole", "goal")), (ROOM_ENV, ROOM_PLAYS, ("you", "box", "wall", "target"))],
    ids=["frozenlake", "sokoban"],
)
def test_page_in_chromium_draws_boards_names_the_model_and_filters_failures(env, plays, marks, tmp_path):
    chromium = _chromium()
    model = "checkpoints/frozenlake-starpo: the policy of iter_000040, trained from smollm2-135m"
    page = tmp_path / "page.html"
    page.write_text(_page(env, plays, model=model))
    # The filter, driven: a script at the end of a copy of the page ticks the box as a click would.
    driven = tmp_path / "driven.html"
    driven.write_text(
        page.read_text().replace("</body>", "<script>document.getElementById('failures-only').click()</script></body>")
    )
    dom = _Dom()
    dom.feed(_dump_dom(chromium, driven.as_uri(), tmp_path / "profile"))

    assert dom.settings["model"] == model and tempfile.gettempdir() not in " ".join(dom.settings.values())
    assert dom.settings["env"] == env
    states = sum(len(turns) + 1 for turns, _ in plays)
    assert dom.boards == states and len(dom.players) == states
    assert len(dom.rows) == len(dom.details) == len(plays)
    # Failures only: every success hidden, in the summary and below, every failure still shown.
    assert [(success, hidden) for _, success, hidden in dom.rows] == [(s, s) for _, s, _ in dom.rows]
    assert [hidden for success, hidden in dom.details] == [success for success, _ in dom.details]
    assert any(success for _, success, _ in dom.rows) and not all(success for _, success, _ in dom.rows)

    image = _screenshot(chromium, page, tmp_path / f"{env.split(':')[1]}.png")
    for mark in marks:
        assert _pixels_of(image, COLOURS[mark]) > 20, f"no {mark} drawn in {image}"


def test_page_in_chromium_sorts_by_a_heading_and_opens_a_linked_trajectory(tmp_path):
    chromium = _chromium()
    page = tmp_path / "page.html"
    page.write_text(trajectories_html(_episodes(ROOM_ENV, ROOM_PLAYS), title="eval"))
    sorted_dom = _dump_dom(chromium, f"{page.as_uri()}#sort=-return", tmp_path / "profile")
    dom = _Dom()
    dom.feed(sorted_dom)
    # Sorted by return, highest first, by the page's own script (#sort=-return).
    assert [cells for cells, _, _ in dom.rows] == [
        ["0", "0", "yes", "", "10.40", "2", "1.00"],
        ["2", "0", "no", "repeated_no_op", "-0.20", "1", "1.00"],
        ["1", "0", "no", "dead_box", "-0.30", "1", "1.00"],
    ]
    # Collapsible; only the first is open, and the one a link's #t2 names is opened too.
    opened = re.compile(r'<details id="(t\d)" data-success="\d" open')
    assert opened.findall(sorted_dom) == ["t0"]
    assert opened.findall(_dump_dom(chromium, f"{page.as_uri()}#t2", tmp_path / "profile")) == ["t0", "t2"]
