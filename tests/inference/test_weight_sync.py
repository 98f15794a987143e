"""StarPO's weight sync, end to end: after every sync the engines score a probe exactly as the
learner does (and a stale engine is caught), with the collective broadcast on gloo (the code
NCCL runs on GPU) and the object store, from the local or a remote learner, into the local
runner's engines or a remote runner's, and into an engine actor that was replaced; a LoRA
policy as merged weights or as its adapter alone, served by vLLM as a LoRA request."""

from __future__ import annotations

import re
import sys
import typing

import pytest
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.algorithm.starpo import StarPOConfig
from rllib_ragen.inference.collective import GroupHost, TensorLayout, receive, send
from rllib_ragen.inference.engine import pack_weights
from rllib_ragen.inference.vllm.adapter import VLLM_MAX_LORA_RANKS
from rllib_ragen.lora import adapter_state_dict
from rllib_ragen.rllib_private import local_learner

GAP = "engine_logp_max_abs_diff"
# fp32 engines against a bf16 learner: the learner's bf16 arithmetic is the only difference, about
# 2e-3 after one `perturb_policy` and 2e-2 after two (measured); a stale engine is off by 0.8 and more.
TOLERANCE = 0.05
STALE = 0.3


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def vllm_config(model_path, **inference) -> StarPOConfig:
    """Tiny StarPO with a bf16 policy and one vLLM-CPU engine (settings its attention kernels accept)."""
    settings = dict(engine="vllm", weight_sync="collective", kv_cache_gb=0.05, max_model_len=1024,
                    engine_threads=1, num_cpus_per_engine=0, weight_sync_timeout_s=60)
    settings.update(inference)
    return (
        StarPOConfig()
        .environment("sokoban")
        .llm(model=str(model_path), critic="head", dtype="bfloat16")
        .rollouts(n_groups=2, group_size=2, max_turns=2, max_actions_per_turn=2, response_length=12)
        .inference(**settings)
        .training(mini_batch_size=2, micro_batch_size=2, rollout_filter_ratio=1.0, actor_lr=1e-3, critic_lr=1e-3)
        .starpo_evaluation(eval_interval=0)
        .debugging(seed=0)
    )


def perturb_policy(learner) -> None:
    """Moves only the tied embedding (also the LM head) and one norm: the tied-head trap, and a layer.

    Moderate moves (2.5x the embedding's init std): larger logits would make the bf16
    learner's own rounding, which the probe also sees, dwarf the tolerance.
    """
    policy = learner.module[DEFAULT_MODULE_ID].unwrapped().policy
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        embedding = policy.get_input_embeddings().weight
        embedding.add_(0.05 * torch.randn_like(embedding))
        policy.model.norm.weight.mul_(1.2)


# ---------------------------------------------------------------------- the transport alone
def test_layout_groups_tensors_by_dtype_within_the_bucket_size():
    pairs = [("a", torch.zeros(10)), ("b", torch.zeros(10, dtype=torch.bfloat16)),
             ("c", torch.zeros(4, 5)), ("d", torch.zeros(100))]
    layout = TensorLayout.of(pairs, bucket_bytes=128)
    # a (40 B) and c (80 B) share a float32 bucket; d (400 B) exceeds it alone; b is another dtype.
    assert layout.buckets == ((0, 2), (1,), (3,))
    assert layout.shapes == ((10,), (10,), (4, 5), (100,))
    assert layout.dtypes == ("float32", "bfloat16", "float32", "float32")
    assert layout.nbytes == 40 + 20 + 80 + 400


@ray.remote(num_cpus=0)
class _Receiver:
    """A fixed process, as an engine is: it keeps its group membership from one sync to the next
    (tasks could land on each other's worker process and drop the group the sender still uses)."""

    def receive(self, spec, rank, layout):
        return receive(spec, rank, layout)


def test_gloo_broadcast_reaches_every_receiver_bit_exact_in_each_dtype():
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "w.bf16": torch.randn(3, 5, generator=generator).to(torch.bfloat16),
        "w.fp16": torch.randn(7, generator=generator).to(torch.float16),
        "w.fp32": torch.randn(2, 2, generator=generator),
        "w.bf16.big": torch.randn(300, generator=generator).to(torch.bfloat16),
    }
    pairs = list(tensors.items())
    layout = TensorLayout.of(pairs, bucket_bytes=64)  # several buckets per dtype
    host = GroupHost(host="127.0.0.1", timeout_s=60)
    receivers = {rank: _Receiver.remote() for rank in (1, 2)}
    for round_ in range(2):  # the second round reuses each member's group
        spec = host.spec(("two receivers",), world_size=3, backend="gloo")
        refs = [receiver.receive.remote(spec, rank, layout) for rank, receiver in receivers.items()]
        send(spec, [tensor for _, tensor in pairs], layout)
        for received in ray.get(refs, timeout=60):
            received = dict(received)
            assert list(sorted(received)) == sorted(tensors)
            for name, tensor in tensors.items():
                assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
        assert spec.generation == 1
        tensors = {name: tensor * 2 for name, tensor in tensors.items()}
        pairs = list(tensors.items())


def test_a_member_that_never_joins_fails_the_send_within_the_timeout():
    """The sender waits for the missing member as long as the group's timeout, and the error names
    that timeout and what it waited for: a key of this generation of the group in the store (the
    group cannot form), or `send`'s own step (a broadcast that does not complete)."""
    host = GroupHost(host="127.0.0.1", timeout_s=2)
    spec = host.spec(("nobody",), world_size=2, backend="gloo")
    layout = TensorLayout.of([("w", torch.zeros(4))])
    with pytest.raises((TimeoutError, RuntimeError)) as error:
        send(spec, [torch.zeros(4)], layout)
    assert re.search(
        r"wait timeout after 2000ms, keys: \S*rllib_ragen/weight_sync/1/"
        r"|sending bucket 1/1 of generation 1 did not complete within 2 s",
        str(error.value),
    ), str(error.value)


# ---------------------------------------------------------------------- StarPO, local learner and runner
@pytest.fixture(scope="module")
def local_algo(tiny_model_path):
    algo = vllm_config(tiny_model_path).build_algo()
    yield algo
    algo.stop()


@pytest.mark.vllm
def test_bf16_policy_synced_by_broadcast_scores_like_the_learner_and_a_stale_engine_shows(local_algo):
    assert local_algo.metrics.peek(("weight_sync", GAP)) < TOLERANCE  # the sync at start
    perturb_policy(local_learner(local_algo.learner_group))
    assert local_algo.weight_sync.check() > STALE  # engines not synced yet: the probe sees it
    local_algo.sync_engine_weights()
    assert local_algo.weight_sync.check() < TOLERANCE

    policy = local_learner(local_algo.learner_group).module[DEFAULT_MODULE_ID].unwrapped().policy
    before = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    result = local_algo.train()
    assert any(not torch.equal(before[n], t) for n, t in policy.state_dict().items())  # the update moved it
    assert all(t.dtype == torch.bfloat16 for t in policy.state_dict().values())
    assert result["weight_sync"][GAP] < TOLERANCE
    assert result["weight_sync"]["megabytes"] == pytest.approx(
        sum(p.numel() * 2 for p in policy.parameters()) / 2**20
    )  # bf16 on the wire, the tied head once


@pytest.mark.vllm
def test_an_engine_killed_between_syncs_is_restored_from_the_learner_before_it_serves(local_algo):
    pool = local_algo.env_runner.engine
    perturb_policy(local_learner(local_algo.learner_group))
    local_algo.sync_engine_weights()
    restarts = pool.restarts
    ray.kill(pool.actors[0])
    local_algo.env_runner.sample()  # the dead engine is replaced mid-call and gets a resync
    assert pool.restarts == restarts + 1
    assert local_algo.weight_sync.check() < TOLERANCE


# ---------------------------------------------------------------------- remote runners, remote learners
def on_remote_learners(algo, change) -> None:
    """Runs `change(learner)` on every remote learner: the learner actor cannot import this test module, so
    the function travels by value."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        algo.learner_group.foreach_learner(change)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


# One algorithm for both remote sides: each costs a process that loads the model, and a test apiece cost the
# slow tier a second start of the pair (39 s on an AVX2-only EPYC).
@pytest.mark.vllm
def test_a_remote_learner_broadcasts_into_a_remote_runners_engines_and_a_replaced_one_joins_the_next(tiny_model_path):
    algo = vllm_config(tiny_model_path).env_runners(num_env_runners=1).learners(num_learners=1).build_algo()
    try:
        assert algo.env_runner is None and algo.learner_group.is_remote
        assert algo.train()["weight_sync"][GAP] < TOLERANCE
        on_remote_learners(algo, perturb_policy)
        assert algo.weight_sync.check() > STALE  # the probe reads the remote learner: the engine is stale
        algo.env_runner_group.foreach_env_runner(lambda r: ray.kill(r.engine.actors[0]), local_env_runner=False)
        algo.sync_engine_weights()  # replaces the dead engine, forms a new group, broadcasts
        assert algo.weight_sync.check() < TOLERANCE
        assert algo.env_runner_group.foreach_env_runner(lambda r: r.engine.restarts, local_env_runner=False) == [1]
    finally:
        algo.stop()


@pytest.mark.slow  # a remote learner and a remote runner: two more processes that load the model
def test_object_store_from_a_remote_learner_into_a_remote_runner_engine(tiny_model_path):
    config = (
        vllm_config(tiny_model_path, engine="hf", weight_sync="object_store")
        .env_runners(num_env_runners=1)
        .learners(num_learners=1)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["weight_sync"][GAP] < TOLERANCE
        engine_state = algo.env_runner_group.foreach_env_runner(
            lambda r: r.engine.model.state_dict(), local_env_runner=False
        )[0]
        learner_state = algo.learner_group.foreach_learner(
            lambda learner: learner.module[DEFAULT_MODULE_ID].unwrapped().policy_state_dict()
        )
        for name, value in next(iter(learner_state)).get().items():
            torch.testing.assert_close(engine_state[name], value.float(), rtol=0, atol=0, msg=name)
    finally:
        algo.stop()


# ---------------------------------------------------------------------- LoRA: merged on the learner
def perturb_adapters(learner, seed: int = 1) -> None:
    """Gives every LoRA B of the policy random values (they start at 0, where merging changes nothing)."""
    policy = learner.module[DEFAULT_MODULE_ID].unwrapped().policy
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=LORA_B_STD)


# Moves the probe's log-probs by more than STALE, while the bf16 learner's rounding stays in TOLERANCE.
LORA_B_STD = 0.15


@pytest.mark.vllm
def test_lora_policy_reaches_vllm_as_merged_weights_and_scores_like_the_learner(tiny_model_path):
    algo = vllm_config(tiny_model_path).llm(lora_rank=8).build_algo()
    try:
        perturb_adapters(local_learner(algo.learner_group))
        stale = algo.weight_sync.check()
        algo.sync_engine_weights()
        synced = algo.weight_sync.check()
        print("probe gap before the sync", stale, "after", synced)
        assert stale > STALE  # the adapters changed the policy; the engine has not seen it yet
        assert synced < TOLERANCE
    finally:
        algo.stop()


# ---------------------------------------------------------------------- LoRA: the adapter alone
@pytest.mark.vllm
def test_the_copy_of_vllms_lora_ranks_is_vllms():
    from vllm.config.lora import MaxLoRARanks

    assert typing.get_args(MaxLoRARanks) == VLLM_MAX_LORA_RANKS


@pytest.fixture(scope="module")
def adapter_algo(tiny_model_path):
    algo = vllm_config(tiny_model_path).llm(lora_rank=8).inference(lora_sync="adapter").build_algo()
    yield algo
    algo.stop()


def _probe_on_engine(algo) -> list[float]:
    prompt, continuation = algo.weight_sync._probe
    return algo.env_runner.engine.score([prompt], [continuation])[0]


@pytest.mark.vllm
def test_lora_adapter_sync_sends_the_adapter_only_and_vllm_serves_it_like_the_learner(adapter_algo):
    learner = local_learner(adapter_algo.learner_group)
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    assert adapter_algo.config.rollout_engine.serves_adapter(adapter_algo.config.lora)
    assert adapter_algo.weight_sync.check() < TOLERANCE  # B = 0 after the start sync: the base model
    base = _probe_on_engine(adapter_algo)
    perturb_adapters(learner)
    stale = adapter_algo.weight_sync.check()
    report = adapter_algo.weight_sync.sync()
    synced = adapter_algo.weight_sync.check()
    merged_nbytes = pack_weights(module.policy_state_dict()).nbytes
    print("probe gap before the sync", stale, "after", synced, "bytes sent", report.nbytes, "merged", merged_nbytes)
    assert stale > STALE  # the adapters changed the policy; the engine still serves the old (zero) one
    assert synced < TOLERANCE
    assert max(abs(a - b) for a, b in zip(_probe_on_engine(adapter_algo), base)) > STALE  # not the base model
    adapter = adapter_state_dict(module.policy)
    assert all(".lora_A." in name or ".lora_B." in name for name in adapter)
    assert report.nbytes == sum(t.numel() * t.element_size() for t in adapter.values())
    assert report.nbytes * 50 < merged_nbytes


@pytest.mark.vllm
def test_a_second_adapter_sync_replaces_the_served_adapter(adapter_algo):
    learner = local_learner(adapter_algo.learner_group)
    perturb_adapters(learner, seed=1)
    adapter_algo.weight_sync.sync()
    assert adapter_algo.weight_sync.check() < TOLERANCE
    first = _probe_on_engine(adapter_algo)
    perturb_adapters(learner, seed=2)
    assert adapter_algo.weight_sync.check() > STALE  # the engine serves the first adapter until the sync
    adapter_algo.weight_sync.sync()
    assert adapter_algo.weight_sync.check() < TOLERANCE  # not a cached copy of the first
    assert max(abs(a - b) for a, b in zip(_probe_on_engine(adapter_algo), first)) > STALE


@pytest.mark.vllm
def test_adapter_sync_through_the_object_store_restores_a_replaced_engine(tiny_model_path):
    config = vllm_config(tiny_model_path, weight_sync="object_store").llm(lora_rank=8).inference(lora_sync="adapter")
    algo = config.build_algo()
    try:
        perturb_adapters(local_learner(algo.learner_group))
        algo.sync_engine_weights()
        assert algo.weight_sync.check() < TOLERANCE
        pool = algo.env_runner.engine
        ray.kill(pool.actors[0])
        algo.env_runner.sample()  # the dead engine is replaced mid-call and reloads the last adapter
        assert pool.restarts == 1
        assert algo.weight_sync.check() < TOLERANCE
    finally:
        algo.stop()


@pytest.mark.vllm
def test_a_remote_learner_sends_the_adapter(tiny_model_path):
    algo = vllm_config(tiny_model_path).llm(lora_rank=8).inference(lora_sync="adapter").learners(num_learners=1)
    algo = algo.build_algo()
    try:
        assert algo.learner_group.is_remote
        on_remote_learners(algo, perturb_adapters)
        assert algo.weight_sync.check() > STALE
        assert algo.weight_sync.sync().nbytes < 2**16  # the adapter (32 KiB), not the 6 MiB of merged weights
        assert algo.weight_sync.check() < TOLERANCE
    finally:
        algo.stop()


# ---------------------------------------------------------------------- the wire dtype
class _Learner:
    """A learner as `_policy_tensors` reads it: module[DEFAULT_MODULE_ID].unwrapped().policy_state_dict()."""

    def __init__(self, tensors):
        self.module = {DEFAULT_MODULE_ID: self}
        self.tensors = tensors

    def unwrapped(self):
        return self

    def policy_state_dict(self, *, adapter):
        return dict(self.tensors)


def test_float32_weights_travel_in_the_engines_bf16_rounded_as_the_engine_rounds_them():
    """An fp32 learner and bf16 engines: the weights go at 2 bytes a value, and each equals what the
    engine's own load (copy_ into its bf16 parameter) makes of the fp32 value; integer buffers stay."""
    from rllib_ragen.inference.engine import unique_weights
    from rllib_ragen.inference.engine_settings import EngineSettings
    from rllib_ragen.inference.weight_sync import Payload, _policy_tensors, wire_dtype

    assert wire_dtype(EngineSettings(kind="vllm", dtype="bfloat16"), adapter=False) == torch.bfloat16
    assert wire_dtype(EngineSettings(kind="vllm", dtype="float32"), adapter=False) is None
    assert wire_dtype(EngineSettings(kind="vllm", dtype="auto"), adapter=False) is None
    weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)) * 0.02
    positions = torch.arange(7)
    learner = _Learner({"w": weight, "pos": positions, "tied_head": weight})
    sent = _policy_tensors(learner, Payload(adapter=False, dtype=torch.bfloat16))
    assert sent["tied_head"] is sent["w"]  # a tied tensor stays one tensor: it travels once
    assert [name for name, _ in unique_weights(sent)] == ["w", "pos"]
    loaded = torch.empty(64, 32, dtype=torch.bfloat16).copy_(weight)  # what the engine's load makes of fp32
    assert sent["w"].dtype == torch.bfloat16 and torch.equal(sent["w"], loaded)
    assert sent["w"].numel() * sent["w"].element_size() == weight.numel() * 2
    assert torch.equal(sent["pos"], positions)
    as_they_are = _policy_tensors(learner, Payload(adapter=False, dtype=None))
    assert as_they_are["w"] is weight  # float32 engines get the learner's tensors unchanged
