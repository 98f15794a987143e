"""Self-play rollouts through RLlib's multi-agent API: each seat's tokens, rewards and advantages land in
that seat's rows and nowhere else, both games' prompts go to the engine in one call per step, and a frozen
opponent (a second engine) keeps bit-identical weights through a training iteration."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from conftest import require_extra
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from run_helpers import ForcedAnswerEngine

from envs.base import INVALID_ANSWER
from envs.user_errors import UserError
from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.inference.engine import Completion, InferenceEngine, SamplingParams
from rllib_ragen.rllib_private import learner_connector
from rllib_ragen.rollout.env_runner import LLMEnvRunner
from rllib_ragen.rollout.game_rollout import FROZEN_MODULE, LEAGUE_MODULE
from rllib_ragen.rollout.self_play_settings import training_mapping
from rllib_ragen.rollout.trajectory_record import failure_kind, turn_validity
from rllib_ragen.training.token_batch import token_batch_of_episodes

require_extra("textarena", "cpu,test,textarena")

from rllib_ragen.rollout.self_play_runner import SelfPlayEnvRunner  # noqa: E402

# player_0 ("O") takes the top row; player_1 ("X") plays 3 and 4 in between: player_0 wins on its third move.
MOVES = {"Player 0": ["0", "1", "2"], "Player 1": ["3", "4"]}


class ScriptedMovesEngine(ForcedAnswerEngine):
    """Answers each seat's next move from `MOVES` (the seat read from the system prompt, the move's index
    from the answers already in the prompt), with the log-probs a real engine gives those tokens."""

    def __init__(self, engine: InferenceEngine, tokenizer, moves: dict[str, list[str]] = MOVES) -> None:
        super().__init__(engine, answer_ids=[])
        self.tokenizer = tokenizer
        self.moves = moves
        self.calls: list[int] = []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        self.calls.append(len(prompts))
        answers = [self._answer(self.tokenizer.decode(prompt)) for prompt in prompts]
        logprobs = self.engine.score(prompts, answers)
        return [Completion(answer, list(lp), "stop") for answer, lp in zip(answers, logprobs)]

    def _answer(self, prompt: str) -> list[int]:
        seat = "Player 0" if "as Player 0" in prompt else "Player 1"
        turn = prompt.count("<|im_start|>assistant") - 1
        text = f"<answer>[{self.moves[seat][turn]}]</answer><|im_end|>"
        return self.tokenizer.encode(text, add_special_tokens=False)


def _config(model_path, **self_play) -> StarPOConfig:
    return (
        StarPOConfig()
        .llm(model=str(model_path), critic="none")
        .rollouts(n_groups=2, response_length=16, think=False, prefill=False, max_actions_per_turn=1)
        .inference(engine="hf", max_model_len=2048)
        .training(advantage_estimator="rae", rollout_filter_ratio=1.0, actor_lr=1e-2, micro_batch_size=2)
        .self_play(self_play_game="TicTacToe-v0", **self_play)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


def test_each_seat_tokens_rewards_and_advantages_land_in_its_own_rows(tiny_model_path, tiny_tokenizer) -> None:
    config = _config(tiny_model_path)
    runner = SelfPlayEnvRunner(config=config)
    engine = runner.engine = ScriptedMovesEngine(runner.engine, tiny_tokenizer)
    episodes = runner.sample(seeds=[1, 2])
    assert engine.calls == [2, 2, 2, 2, 2]  # five moves; each step's prompts of both games in one call
    assert [r.rewards for r in runner.last_game_results] == [{"player_0": 1.0, "player_1": -1.0}] * 2
    # Every move was legal: each seat's turns count as valid, and the loser's failure is no invalid answer.
    for episode in episodes:
        assert [turn_validity(episode.agent_episodes[s]) for s in ("player_0", "player_1")] == [[1.0] * 3, [1.0] * 2]
        assert failure_kind(episode.agent_episodes["player_1"]) != INVALID_ANSWER
    learner = config.build_learner(spaces=runner.get_spaces())
    batch = learner_connector(learner)(
        rl_module=learner.module, batch={}, episodes=episodes, shared_data={}, metrics=None
    )[DEFAULT_MODULE_ID]
    tokens = token_batch_of_episodes(episodes, history_window=None)
    layout = tokens.trajectories
    assert layout.roles == ("TicTacToe-v0/player_0", "TicTacToe-v0/player_1") * 2
    # RAE from baselines 0: b = 0.05 * (the role's mean reward) -> A = +-(1 - 0.05) = +-0.95.
    expected = {"TicTacToe-v0/player_0": (1.0, 0.95, 3), "TicTacToe-v0/player_1": (-1.0, -0.95, 2)}
    row_of_trajectory = tokens.traj_of.new_full((tokens.input_ids.shape[0],), -1)
    row_of_trajectory[tokens.row_of] = tokens.traj_of
    for b, role in enumerate(layout.roles):
        reward, advantage, turns = expected[role]
        seat = role.split("/")[1]
        agent = episodes[b // 2].agent_episodes[seat]
        assert layout.turn_rewards[b].sum() == reward and int(layout.turn_ends[b].sum()) == turns == len(agent)
        rows = (row_of_trajectory == b).nonzero().squeeze(1)
        generated = batch[Columns.LOSS_MASK][rows].bool()
        # The seat's own sampled ids, every turn in order, and nothing else, are what its rows train on.
        assert tokens.input_ids[rows][generated].tolist() == [int(t) for a in agent.get_actions() for t in a]
        assert torch.allclose(batch[Columns.ADVANTAGES][rows][generated], torch.tensor(advantage))
        assert not batch[Columns.ADVANTAGES][rows][~generated].any()


def test_an_occupied_cell_is_the_movers_invalid_turn_only(tiny_model_path, tiny_tokenizer) -> None:
    # player_1 answers player_0's cell: SPIRAL's rule ends the game there, -1.5 to it and +0.5 to player_0.
    runner = SelfPlayEnvRunner(config=_config(tiny_model_path))
    runner.engine = ScriptedMovesEngine(runner.engine, tiny_tokenizer, {"Player 0": ["4"], "Player 1": ["4"]})
    (episode,) = runner.sample(seeds=[1])
    assert runner.last_game_results[0].rewards == {"player_0": 0.5, "player_1": -1.5}
    first, second = episode.agent_episodes["player_0"], episode.agent_episodes["player_1"]
    assert turn_validity(first) == [1.0] and failure_kind(first) != INVALID_ANSWER
    assert turn_validity(second) == [0.0] and failure_kind(second) == INVALID_ANSWER


def _first_states(episodes) -> list[str]:
    """Each game's first state as its first seat to move saw it (the opening's messages, if any)."""
    return [max((a.get_observations()[0] for a in e.agent_episodes.values()), key=len) for e in episodes]


def test_training_games_open_at_random_and_evaluation_games_from_the_empty_board(tiny_model_path) -> None:
    runner = SelfPlayEnvRunner(config=_config(tiny_model_path, training_opening_moves=3, max_game_turns=9))
    seeds = list(range(12))
    assert {state.count("Current Board") for state in _first_states(runner.sample(seeds=seeds))} > {1}
    assert {state.count("Current Board") for state in _first_states(runner.sample(seeds=seeds, evaluation=True))} == {1}
    with pytest.raises(UserError, match="max_opening_moves must be from 0"):
        StarPOConfig().self_play(self_play_game="TicTacToe-v0", max_game_turns=9, training_opening_moves=9)


def test_evaluation_openings_vary_the_games_and_repeat_in_every_evaluation(tiny_model_path) -> None:
    runner = SelfPlayEnvRunner(config=_config(tiny_model_path, game_eval_opening_moves=2, max_game_turns=9))
    seeds = list(range(12))
    first = _first_states(runner.sample(seeds=seeds, evaluation=True))
    assert {1} < {state.count("Current Board") for state in first} <= {1, 2, 3}  # after 0, 1 or 2 opening moves
    # The openings come from each game's seed: a later evaluation on the same seeds opens the same games.
    assert _first_states(runner.sample(seeds=seeds, evaluation=True)) == first
    assert {state.count("Current Board") for state in _first_states(runner.sample(seeds=seeds))} == {1}
    with pytest.raises(UserError, match="max_opening_moves must be from 0"):
        StarPOConfig().self_play(self_play_game="TicTacToe-v0", max_game_turns=9, game_eval_opening_moves=9)


def test_self_play_is_switched_by_its_builder_and_rae_needs_it() -> None:
    config = StarPOConfig().self_play(self_play_game="TicTacToe-v0")
    assert config.env_runner_cls is SelfPlayEnvRunner
    # The run's header counts games, not the single-seat env's groups x group size.
    assert config.rollout_summary.startswith("TicTacToe-v0 self-play: 8 games an iteration against 'self', at most ")
    assert "groups x" not in config.rollout_summary
    config.env_runner_cls = LLMEnvRunner
    with pytest.raises(ValueError, match="needs the self-play env runner"):
        config.validate_starpo()
    assert StarPOConfig().self_play(self_play_game="KuhnPoker-v0").self_play(self_play_game=None).env_runner_cls is (
        LLMEnvRunner
    )
    with pytest.raises(ValueError, match="'rae' needs two-player self-play"):
        StarPOConfig().training(advantage_estimator="rae").validate_starpo()
    with pytest.raises(ValueError, match="self_play_opponent"):
        StarPOConfig().self_play(self_play_opponent="expert")


def test_a_league_of_opponents_takes_the_games_in_pairs_one_on_each_seat() -> None:
    settings = StarPOConfig().self_play(self_play_game="TicTacToe-v0", self_play_opponent=("self", "random", "frozen"))
    games = settings.two_player
    assert games.training_opponents == ("self", "random", "frozen") and games.frozen_opponent and not games.league
    mapping = training_mapping(games)
    seats = [tuple(mapping(seat, None, game_index=i) for seat in ("player_0", "player_1")) for i in range(8)]
    trained, frozen = DEFAULT_MODULE_ID, FROZEN_MODULE
    assert seats == [
        (trained, trained),
        (trained, trained),
        (trained, "random"),
        ("random", trained),
        (trained, frozen),
        (frozen, trained),
        (trained, trained),
        (trained, trained),
    ]
    # One name is the one-opponent league it always was: seats alternate against it, game by game.
    single = training_mapping(StarPOConfig().self_play(self_play_opponent="minimax").two_player)
    assert [single("player_0", None, game_index=i) for i in range(4)] == [trained, "minimax"] * 2
    assert StarPOConfig().self_play(self_play_opponent=("random", "league")).two_player.league
    with pytest.raises(ValueError, match="self_play_opponent"):
        StarPOConfig().self_play(self_play_opponent=("random", "expert"))
    with pytest.raises(ValueError, match="names no opponent"):
        StarPOConfig().self_play(self_play_opponent=())


def test_rae_keys_a_league_game_by_its_opponent_and_a_self_play_game_by_its_seat(tiny_model_path) -> None:
    # The tiny model's answers are no moves: each game ends at the trained seat's first turn (an invalid move),
    # so a self-play game holds player 0's trajectory only, and a game against random play the trained seat's.
    runner = SelfPlayEnvRunner(config=_config(tiny_model_path, self_play_opponent=("self", "random")))
    episodes = runner.sample(seeds=[1, 2, 3, 4])
    roles = token_batch_of_episodes(episodes, history_window=None).trajectories.roles
    assert roles == (
        "TicTacToe-v0/player_0",
        "TicTacToe-v0/player_0",
        "TicTacToe-v0/player_0/vs_random",
        "TicTacToe-v0/player_1/vs_random",
    )


@pytest.mark.slow
def test_training_against_the_league_refreshes_its_snapshot_and_the_frozen_one_stays_bit_identical(
    ray_session, tiny_model_path
) -> None:
    """The league's snapshot takes the trained weights every 2nd update only; the frozen snapshot (the policy the
    run started from, evaluation's "frozen" opponent) never changes."""
    config = _config(tiny_model_path, self_play_opponent="league", game_eval_opponents=("random", "frozen"))
    config = config.self_play(league_refresh_interval=2, game_eval_games=2).starpo_evaluation(eval_interval=1, eval_size=2)
    algo = config.build_algo()

    def weights(engine) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in engine.model.state_dict().items()}

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    try:
        runner = algo.env_runner
        assert isinstance(runner, SelfPlayEnvRunner)
        assert len({id(runner.engine), id(runner.frozen_engine), id(runner.league_engine)}) == 3
        start = weights(runner.frozen_engine)
        assert same(weights(runner.league_engine), start) and same(weights(runner.engine), start)
        first = algo.train()
        assert {r.modules[s] for r in runner.last_game_results for s in r.modules} == {DEFAULT_MODULE_ID, FROZEN_MODULE}
        assert not same(weights(runner.engine), start)  # it trained
        assert same(weights(runner.league_engine), start)  # iteration 1: not the league's turn
        assert first["self_play"]["league_iteration"] == 0
        second = algo.train()
        assert not same(weights(runner.engine), start)
        assert same(weights(runner.league_engine), weights(runner.engine))  # iteration 2: refreshed
        assert second["self_play"]["league_iteration"] == 2 and second["self_play"]["league_sync_seconds"] > 0
        assert "league_sync_seconds" not in first["self_play"]
        assert same(weights(runner.frozen_engine), start)
        evaluation = second["evaluation"]
        for opponent in ("random", "frozen"):
            rates = [evaluation[f"vs_{opponent}/{o}_rate"] for o in ("win", "draw", "loss")]
            assert sum(rates) == pytest.approx(1.0) and evaluation[f"vs_{opponent}/games"] == 2
        runner.sample(seeds=[0, 1])  # training games: the league's snapshot on the other seat
        assert {r.modules[s] for r in runner.last_game_results for s in r.modules} == {DEFAULT_MODULE_ID, LEAGUE_MODULE}
    finally:
        algo.stop()
