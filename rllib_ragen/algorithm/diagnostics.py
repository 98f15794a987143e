"""Step 2 of an iteration: RAGEN-2's collapse diagnostics and the echo-trap monitor, on each batch.

The diagnostics (`rllib_ragen.training.collapse_metrics`) score sampled first turns
on a learner, before the filter and with the weights that sampled them; the monitor
(`rllib_ragen.training.collapse_metrics`) watches the in-group reward spread and the
diagnostics, and warns when one stays far below its early level.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import TIMERS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.models import load_tokenizer, resolve_model
from rllib_ragen.rollout.prompt.prompt_protocol import ProtocolSettings
from rllib_ragen.rollout.prompt.token_history import ChatTemplate
from rllib_ragen.training.collapse_metrics import (
    COLLAPSE_RESULTS,
    CONDITIONAL_ENTROPY,
    MUTUAL_INFORMATION,
    REWARD_VARIANCE,
    CollapseMetricsSettings,
    EchoTrapMonitor,
    EchoTrapSettings,
    collapse_metrics,
    draw_samples,
    first_turn_samples,
)

if TYPE_CHECKING:
    from rllib_ragen.training.learner import StarPOTorchLearner

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
