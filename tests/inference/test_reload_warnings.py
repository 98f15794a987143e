"""vLLM's layerwise reload warns for every layer a sync names no weight of: the two expected every sync
(the tied head, the rotary cache) are dropped, any other still reaches the log."""

import logging

import pytest

from rllib_ragen.inference.vllm.reload import LAYERWISE_LOGGER, quiet_expected_unloaded_layers


@pytest.fixture
def layerwise_logger():
    logger = logging.getLogger(LAYERWISE_LOGGER)
    filters = list(logger.filters)
    yield logger
    logger.filters[:] = filters


def test_only_the_expected_unloaded_layers_are_quiet(layerwise_logger, caplog):
    quiet_expected_unloaded_layers()
    quiet_expected_unloaded_layers()  # once per process, however many syncs
    assert len(layerwise_logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=LAYERWISE_LOGGER):
        for layer in ("ParallelLMHead", "RotaryEmbedding", "QKVParallelLinear"):
            layerwise_logger.warning("%s: Failed to load weights", layer)
        layerwise_logger.warning("%s: something else", "RotaryEmbedding")
    assert [r.getMessage() for r in caplog.records] == [
        "QKVParallelLinear: Failed to load weights",
        "RotaryEmbedding: something else",
    ]
