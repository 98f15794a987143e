"""Step 2 of an iteration: RAGEN-2's collapse diagnostics and the echo-trap monitor, on each batch.

The diagnostics (`rllib_ragen.training.collapse_metrics`) score sampled first turns
on a learner, before the filter and with the weights that sampled them; the monitor
(`rllib_ragen.training.echo_trap`) watches the in-group reward spread and the
diagnostics, and warns when one stays far below its early level.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import numpy as np
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.metrics import TIMERS
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_ragen.models import load_tokenizer, resolve_model
from rllib_ragen.rollout.prompt.chat_template import ChatTemplate
from rllib_ragen.training.collapse_metrics import (
    COLLAPSE_RESULTS,
    CONDITIONAL_ENTROPY,
    MUTUAL_INFORMATION,
    collapse_metrics,
    draw_samples,
    first_turn_samples,
)
from rllib_ragen.training.echo_trap import REWARD_VARIANCE, EchoTrapMonitor
from rllib_ragen.training.filtering import FILTER_RESULTS, IN_GROUP_STD_BEFORE

if TYPE_CHECKING:
    from rllib_ragen.training.learner import StarPOTorchLearner

logger = logging.getLogger(__name__)

COLLAPSE_TIMER = "collapse_metrics"
ECHO_TRAP_RESULTS = "echo_trap"


class BatchDiagnostics:
    """The collapse diagnostics (`.diagnostics()`, logged under `collapse/`) and the echo-trap
    monitor (`echo_trap/`: 0/1 per signal, a warning when a collapse starts).

    Args:
        config: The algorithm's `StarPOConfig`.
        metrics: The algorithm's metrics logger.
    """

    def __init__(self, config: AlgorithmConfig, metrics: MetricsLogger) -> None:
        self.config = config
        self.metrics = metrics
        self.echo_trap = EchoTrapMonitor(config.echo_trap_settings)
        self._echo_trap_active: set[str] = set()  # signals warned about: logged once per collapse
        self._collapse_measured = False  # this process's first iteration measures (the early level)
        self._chat_template: ChatTemplate | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        """The policy tokenizer's chat template (loaded on first use)."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_tokenizer(load_tokenizer(resolve_model(self.config.llm_model)))
        return self._chat_template

    def measure_collapse(
        self, episodes: list[MultiAgentEpisode], *, iteration: int, learner_group: LearnerGroup
    ) -> dict[str, float]:
        """The collapse diagnostics of this batch when due, scored on a learner; {} when not due or
        when the sampled thoughts come from fewer than 2 groups."""
        settings = self.config.collapse_metrics_settings
        if not settings.due(iteration, first=not self._collapse_measured):
            return {}
        self._collapse_measured = True
        protocol = self.config.protocol_settings
        candidates = (
            first_turn_samples(episodes, encode=self.chat_template.encode, prefill_text=protocol.prefill_text)
            if protocol.think
            else []
        )
        rng = np.random.default_rng([self.config.seed or 0, iteration])
        samples = draw_samples(candidates, settings.collapse_metrics_samples, rng)
        self.metrics.log_value((COLLAPSE_RESULTS, "candidates"), float(len(candidates)), window=1)
        if len({s.group_id for s in samples}) < 2:
            return {}
        with self.metrics.log_time((TIMERS, COLLAPSE_TIMER)):
            results = learner_group.foreach_learner(
                functools.partial(
                    _collapse_metrics_on_learner, samples=samples, micro_batch_size=self.config.micro_batch_size
                )
            )
        first = next(iter(results))  # every learner holds the same weights
        if not first.ok:
            raise first.get()
        metrics = first.get()
        for key, value in metrics.items():
            self.metrics.log_value((COLLAPSE_RESULTS, key), value, window=1)
        return metrics

    def watch_echo_trap(self, collapse: dict[str, float]) -> None:
        """Feeds the monitor this iteration's in-group reward spread (as the filter logged it, over
        all groups) and `collapse`; logs a 0/1 metric per signal and a warning when a collapse starts."""
        measurements = {
            REWARD_VARIANCE: float(self.metrics.peek((FILTER_RESULTS, IN_GROUP_STD_BEFORE))),
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
