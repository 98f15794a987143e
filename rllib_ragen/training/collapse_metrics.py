"""RAGEN-2's collapse diagnostics: I(X;Z) and H(Z|X) of the reasoning, by cross-scoring, and the
echo-trap monitor that warns when a collapse signal stays far below its early level (`EchoTrapMonitor`);
`BatchDiagnostics` runs both as step 2 of an iteration (the diagnostics on a learner, before the
filter and with the weights that sampled the batch).

RAGEN-2 separates two ways reasoning degrades under RL:

- entropy collapse: for a given prompt the model writes (nearly) the same
  reasoning every time, a low conditional entropy H(Z|X);
- template collapse: the reasoning no longer depends on the prompt, a low
  mutual information I(X;Z) between prompts X and reasoning Z.

Both are estimated on M sampled first turns of a rollout batch. X is the
first prompt up to and including the `<think>` tag (system prompt, state,
assistant header); Z is the reasoning between `<think>` and `</think>`, tags
excluded, re-tokenised from the stripped thought as RAGEN-2 does; turns
without a thought are left out. Every reasoning z_i is scored under the
prompt x_j of every sampled group (teacher forcing with the learner's model,
at the rollout temperature), giving a matrix of log p(z_i | x_j). With the
prompts weighted uniformly over the sampled groups (the batch's empirical
distribution) and p_mix(z) = mean_j p(z | x_j):

    H(Z|X) ~ -mean_i log p(z_i | x_own(i))
    H(Z)   ~ -mean_i log p_mix(z_i)
    I(X;Z) ~ H(Z) - H(Z|X) = mean_i [log p(z_i | x_own(i)) - log p_mix(z_i)]  (at most log N)

Each is reported per token (each row's log-probs divided by the reasoning's
length, RAGEN-2's headline numbers) and per sequence (`_seq`). A Monte Carlo
estimate: I(X;Z) may dip slightly below 0 when the true value is about 0.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import TIMERS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.models import load_tokenizer, resolve_model
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.rollout.trajectory_record import response_text, think_text, trajectory_start, turn_record
from rllib_ragen.training.learner_connector import score_rows

if TYPE_CHECKING:
    from rllib_ragen.training.learner import StarPOTorchLearner
    from rllib_ragen.training.module import LLMRLModule

Tensor = torch.Tensor

COLLAPSE_RESULTS = "collapse"
MUTUAL_INFORMATION = "mutual_information"
CONDITIONAL_ENTROPY = "conditional_entropy"
REASONING_ENTROPY = "reasoning_entropy"
THINK_OPEN = "<think>"


@dataclasses.dataclass(frozen=True)
class CollapseMetricsSettings:
    """When and on how many samples the diagnostics run (set with `StarPOConfig.diagnostics()`).

    Defaults are RAGEN-2's (`collapse_detection`: every 5 steps, 64 samples).

    Each field is documented where `StarPOConfig.diagnostics()` sets it.
    """

    collapse_metrics_interval: int = 5
    collapse_metrics_samples: int = 64

    def __post_init__(self) -> None:
        if self.collapse_metrics_interval < 0:
            raise ValueError(f"collapse_metrics_interval must be >= 0 (0 = off), got {self.collapse_metrics_interval}")
        if self.collapse_metrics_samples < 2:
            raise ValueError(f"collapse_metrics_samples must be >= 2, got {self.collapse_metrics_samples}")

    def due(self, iteration: int, *, first: bool) -> bool:
        """Whether iteration `iteration` (from 1) measures: the run's first one (the early
        level the echo-trap monitor compares with) and every `interval`-th."""
        interval = self.collapse_metrics_interval
        return interval > 0 and (first or iteration % interval == 0)


@dataclasses.dataclass(frozen=True)
class ReasoningSample:
    """One first turn: its prompt X (through `<think>`), its reasoning Z (no tags), and its group."""

    prompt_ids: tuple[int, ...]
    reasoning_ids: tuple[int, ...]
    group_id: int


def first_turn_samples(
    episodes: Sequence, *, encode: Callable[[str], list[int]], prefill_text: str
) -> list[ReasoningSample]:
    """The (X, Z) pair of every trajectory's first turn that has a non-empty thought.

    Args:
        episodes: Group episodes (`MultiAgentEpisode`) as `LLMEnvRunner` makes them.
        encode: Text -> token ids, the policy's tokenizer without special tokens added.
        prefill_text: The protocol's answer prefill; `<think>` is appended to
            the prompt unless the prefill already put it there.
    """
    think_tag = () if prefill_text.endswith(THINK_OPEN) else tuple(encode(THINK_OPEN))
    samples = []
    for episode in episodes:
        for agent in episode.agent_episodes.values():
            if len(agent) == 0:
                continue
            thought = think_text(response_text(agent.get_infos(1)))
            if not thought:
                continue
            start = trajectory_start(agent)
            prompt = (*start.system_ids, *turn_record(agent, 0).user_ids, *think_tag)
            samples.append(ReasoningSample(tuple(int(i) for i in prompt), tuple(encode(thought)), start.group_id))
    return samples


def draw_samples(samples: Sequence[ReasoningSample], count: int, rng: np.random.Generator) -> list[ReasoningSample]:
    """`count` samples drawn uniformly without replacement (all of them when there are fewer)."""
    if len(samples) <= count:
        return list(samples)
    return [samples[i] for i in sorted(rng.choice(len(samples), size=count, replace=False))]


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Right-padded token rows in the layout `score_rows` scores ([R, L] each)."""

    input_ids: Tensor
    attention_mask: Tensor
    generated_mask: Tensor


@torch.no_grad()
def cross_log_probs(
    module: LLMRLModule, prompts: Sequence[Sequence[int]], reasonings: Sequence[Sequence[int]], *, micro_batch_size: int
) -> Tensor:
    """[M, P] summed log-prob of reasoning i after prompt j under `module`'s policy (teacher forcing).

    Args:
        module: An `LLMRLModule` (scored as in training: its temperature, chunking, autocast).
        prompts: P prompts X_j (token ids).
        reasonings: M reasonings Z_i (token ids, each non-empty).
        micro_batch_size: Rows per forward pass.
    """
    rows = [(list(x), list(z)) for z in reasonings for x in prompts]
    width = max(len(x) + len(z) for x, z in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    generated_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, (x, z) in enumerate(rows):
        input_ids[r, : len(x) + len(z)] = torch.tensor(x + z)
        attention_mask[r, : len(x) + len(z)] = 1
        generated_mask[r, len(x) : len(x) + len(z)] = 1
    logp, _ = score_rows(module, _Rows(input_ids, attention_mask, generated_mask), micro_batch_size, with_values=False)
    assert logp is not None, "score_rows returns log-probs when with_logp (the default)"
    return logp.sum(dim=1).view(len(reasonings), len(prompts))


def information_estimates(cross_logp: Tensor, own_prompt: Tensor) -> dict[str, float]:
    """I(X;Z), H(Z|X) and H(Z) from cross log-probs, prompts weighted uniformly (module docstring).

    Args:
        cross_logp: [M, N] log p(z_i | x_j) of every reasoning i under every prompt j.
        own_prompt: [M] long, the column of the prompt each reasoning was sampled from.

    Returns:
        {"mutual_information", "conditional_entropy", "reasoning_entropy"}, in nats.
    """
    if cross_logp.dim() != 2 or own_prompt.shape != cross_logp.shape[:1]:
        raise ValueError(
            f"cross_logp must be [M, N] and own_prompt [M], got {tuple(cross_logp.shape)} and {tuple(own_prompt.shape)}"
        )
    cross_logp = cross_logp.double()
    matched = cross_logp[torch.arange(cross_logp.shape[0]), own_prompt]
    marginal = torch.logsumexp(cross_logp, dim=1) - math.log(cross_logp.shape[1])
    return {
        MUTUAL_INFORMATION: float((matched - marginal).mean()),
        CONDITIONAL_ENTROPY: float(-matched.mean()),
        REASONING_ENTROPY: float(-marginal.mean()),
    }


def collapse_metrics(
    module: LLMRLModule, samples: Sequence[ReasoningSample], *, micro_batch_size: int
) -> dict[str, float]:
    """The diagnostics of `samples` under `module` (runs where the learner's module is).

    Columns are the samples' groups (>= 2 needed); a prompt shared by several
    groups is scored once.

    Returns:
        Per-token and per-sequence (`_seq`) estimates, `mi_upper_bound` (log N),
        `num_samples` and `num_prompts`.
    """
    groups = sorted({s.group_id for s in samples})
    if len(groups) < 2:
        raise ValueError(f"the collapse diagnostics need samples of >= 2 groups, got {len(groups)}")
    prompt_of_group = {s.group_id: s.prompt_ids for s in samples}
    distinct = sorted(set(prompt_of_group.values()))
    scored = cross_log_probs(module, distinct, [s.reasoning_ids for s in samples], micro_batch_size=micro_batch_size)
    cross = scored[:, [distinct.index(prompt_of_group[g]) for g in groups]]  # [M, N]: one column per group
    own = torch.tensor([groups.index(s.group_id) for s in samples])
    lengths = torch.tensor([float(len(s.reasoning_ids)) for s in samples])
    per_token = information_estimates(cross / lengths[:, None], own)
    per_sequence = information_estimates(cross, own)
    return {
        **per_token,
        **{f"{key}_seq": value for key, value in per_sequence.items()},
        "mi_upper_bound": math.log(len(groups)),
        "num_samples": float(len(samples)),
        "num_prompts": float(len(groups)),
    }


REWARD_VARIANCE = "reward_variance"
# Signal -> (the collapse it shows, what it measures, what its collapse means).
COLLAPSE_SIGNALS: dict[str, tuple[str, str, str]] = {
    REWARD_VARIANCE: (
        "reward-variance collapse",
        "in-group reward std",
        "groups no longer disagree in reward, so updates carry no signal (or every trajectory already succeeds)",
    ),
    CONDITIONAL_ENTROPY: (
        "entropy collapse",
        "H(Z|X)",
        "the model writes nearly the same reasoning every time for a given prompt",
    ),
    MUTUAL_INFORMATION: (
        "template collapse",
        "I(X;Z)",
        "the reasoning no longer depends on the prompt: one template for every input",
    ),
}


@dataclasses.dataclass(frozen=True)
class EchoTrapSettings:
    """When a signal counts as collapsed (`StarPOConfig.diagnostics()` sets these as `echo_trap_<name>`).

    Each field is documented where `StarPOConfig.diagnostics()` sets it (as `echo_trap_<field>`).
    """

    baseline_iters: int = 3
    patience: int = 3
    ratio: float = 0.2

    def __post_init__(self) -> None:
        for name in ("baseline_iters", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"echo_trap_{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.ratio < 1:
            raise ValueError(f"echo_trap_ratio must be in (0, 1), got {self.ratio}")


class EchoTrapMonitor:
    """Applies an `EchoTrapSettings` to every signal of `COLLAPSE_SIGNALS`, one `update` per iteration."""

    def __init__(self, rule: EchoTrapSettings = EchoTrapSettings()) -> None:
        self.rule = rule
        self._iterations = 0
        self._early: dict[str, list[float]] = defaultdict(list)
        self._low_streak: dict[str, int] = defaultdict(int)

    def baseline(self, signal: str) -> float | None:
        """The signal's early level, once the baseline iterations are over and it was measured in them."""
        values = self._early[signal]
        if self._iterations < self.rule.baseline_iters or not values:
            return None
        return sum(values) / len(values)

    def update(self, measurements: Mapping[str, float | None]) -> dict[str, str]:
        """Records one iteration; returns {signal: warning} for every signal that has collapsed.

        Args:
            measurements: Signal name (a `COLLAPSE_SIGNALS` key) -> this iteration's
                value; None, NaN or a missing name = not measured this iteration.
        """
        unknown = set(measurements) - set(COLLAPSE_SIGNALS)
        if unknown:
            raise ValueError(f"unknown echo-trap signals {sorted(unknown)}; known: {sorted(COLLAPSE_SIGNALS)}")
        self._iterations += 1
        warnings = {}
        for signal, value in measurements.items():
            if value is None or not math.isfinite(value):
                continue
            if self._iterations <= self.rule.baseline_iters:
                self._early[signal].append(float(value))
                continue
            baseline = self.baseline(signal)
            if baseline is None or baseline <= 0:
                continue
            low = value < self.rule.ratio * baseline
            self._low_streak[signal] = self._low_streak[signal] + 1 if low else 0
            if self._low_streak[signal] >= self.rule.patience:
                warnings[signal] = self._warning(signal, value, baseline)
        return warnings

    def _warning(self, signal: str, value: float, baseline: float) -> str:
        kind, measure, meaning = COLLAPSE_SIGNALS[signal]
        return (
            f"echo trap, {kind}: {measure} {value:.4g} has stayed below {self.rule.ratio:g} x its early level "
            f"{baseline:.4g} for {self._low_streak[signal]} measurements; {meaning}. Consider stopping, "
            "rollout_filter_strategy='top_p' or a higher temperature"
        )


logger = logging.getLogger(__name__)

COLLAPSE_TIMER = "collapse_metrics"
ECHO_TRAP_RESULTS = "echo_trap"


class BatchDiagnostics:
    """The collapse diagnostics (`.diagnostics()`, logged under `collapse/`) and the echo-trap
    monitor (`echo_trap/`: 0/1 per signal, a warning when a collapse starts).

    Args:
        settings: When and on how many samples the diagnostics run.
        echo_trap: When the monitor counts a signal as collapsed.
        metrics: The algorithm's metrics logger.
        protocol: The prompts' protocol (a thought is sampled in think mode only).
        model: The policy's model (its tokenizer's chat template encodes the samples).
        micro_batch_size: Rows a learner scores at once.
        seed: The run's seed (with the iteration, it draws the samples).
    """

    def __init__(
        self,
        settings: CollapseMetricsSettings,
        echo_trap: EchoTrapSettings,
        metrics: MetricsLogger,
        *,
        protocol: ProtocolSettings,
        model: str,
        micro_batch_size: int,
        seed: int,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.protocol, self.model, self.micro_batch_size, self.seed = protocol, model, micro_batch_size, seed
        self.echo_trap = EchoTrapMonitor(echo_trap)
        self._echo_trap_active: set[str] = set()  # signals warned about: logged once per collapse
        self._collapse_measured = False  # this process's first iteration measures (the early level)
        self._chat_template: ChatTemplate | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        """The policy tokenizer's chat template (loaded on first use)."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_tokenizer(load_tokenizer(resolve_model(self.model)))
        return self._chat_template

    def measure_collapse(
        self, episodes: list[MultiAgentEpisode], *, iteration: int, learner_group: LearnerGroup
    ) -> dict[str, float]:
        """The collapse diagnostics of this batch when due, scored on a learner; {} when not due or
        when the sampled thoughts come from fewer than 2 groups."""
        settings = self.settings
        if not settings.due(iteration, first=not self._collapse_measured):
            return {}
        self._collapse_measured = True
        protocol = self.protocol
        candidates = (
            first_turn_samples(episodes, encode=self.chat_template.encode, prefill_text=protocol.prefill_text)
            if protocol.think
            else []
        )
        rng = np.random.default_rng([self.seed, iteration])
        samples = draw_samples(candidates, settings.collapse_metrics_samples, rng)
        self.metrics.log_value((COLLAPSE_RESULTS, "candidates"), float(len(candidates)), window=1)
        if len({s.group_id for s in samples}) < 2:
            return {}
        with self.metrics.log_time((TIMERS, COLLAPSE_TIMER)):
            results = learner_group.foreach_learner(
                functools.partial(_collapse_metrics_on_learner, samples=samples, micro_batch_size=self.micro_batch_size)
            )
        first = next(iter(results))  # every learner holds the same weights
        if not first.ok:
            raise first.get()
        metrics = first.get()
        for key, value in metrics.items():
            self.metrics.log_value((COLLAPSE_RESULTS, key), value, window=1)
        return metrics

    def watch_echo_trap(self, collapse: dict[str, float], *, in_group_reward_std: float) -> None:
        """Feeds the monitor this iteration's in-group reward spread (the filter's, over all groups) and
        `collapse`; logs a 0/1 metric per signal and a warning when a collapse starts."""
        measurements = {
            REWARD_VARIANCE: in_group_reward_std,
            CONDITIONAL_ENTROPY: collapse.get(CONDITIONAL_ENTROPY),
            MUTUAL_INFORMATION: collapse.get(MUTUAL_INFORMATION),
        }
        warnings = self.echo_trap.update(measurements)
        for signal in measurements:
            if signal in warnings and signal not in self._echo_trap_active:
                logger.warning(warnings[signal])
            self.metrics.log_value((ECHO_TRAP_RESULTS, signal), float(signal in warnings), window=1)
        self._echo_trap_active = set(warnings)


def _collapse_metrics_on_learner(
    learner: StarPOTorchLearner, *, samples: list, micro_batch_size: int
) -> dict[str, float]:
    """Runs on a learner: the collapse diagnostics under its current module."""
    return collapse_metrics(learner.module[DEFAULT_MODULE_ID].unwrapped(), samples, micro_batch_size=micro_batch_size)
