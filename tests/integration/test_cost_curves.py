"""`benchmarks/cost_curves.py`: one tiny-model point end to end, the fit on hand-made numbers, the model shapes."""

import importlib
import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllib_ragen.models.tiny_random import install_vendored_tokenizer

ROOT = Path(__file__).resolve().parents[2]
# The scripts import their sibling benchmarks by name, as they do when run.
sys.path.insert(0, str(ROOT / "benchmarks"))
cost_curves = importlib.import_module("cost_curves")
cost_report = importlib.import_module("cost_report")
shapes = importlib.import_module("shaped_random_models")


def test_a_tiny_point_splits_its_iterations_into_rollout_update_and_sync(ray_session, tiny_model_path):
    args = cost_curves.parse_args(["--model", str(tiny_model_path), "--engine", "hf", "--iters", "2"])
    point = cost_curves.measure_point(cost_curves.point_config(args, "trajectories", "16"), args.iters)
    assert len(point["iterations"]) == 2
    for row in point["iterations"]:
        assert row["trajectories"] == 16 and 1 <= row["turns_mean"] <= 5
        assert row["rollout_s"] > 0 and row["sync_s"] > 0 and row["update_s"] > 0
        assert math.isclose(row["rollout_s"] + row["update_s"] + row["sync_s"], row["seconds"], rel_tol=1e-9)
        assert row["generation_s"] <= row["rollout_s"]
    assert point["seconds"] == point["iterations"][1]["seconds"]  # the median of iteration 2 alone
    assert point["generation_gflops"] > 0 and point["parameters"] >= point["trained_parameters"] > 0
    # The HF engine has no prefix cache: it computes every prompt position, which sampled tokens alone leave out.
    assert point["prefilled_tokens"] > 0 and point["generation_computed_gflops"] > point["generation_gflops"]
    assert point["processes"][0]["peak_mb"] > 0 and any(p["role"] == "driver" for p in point["processes"])


def test_the_fit_recovers_hand_made_lines():
    fit = cost_report.linear_fit([16, 32, 64, 128], [2 + 0.5 * x for x in (16, 32, 64, 128)])
    assert fit["intercept"] == pytest.approx(2) and fit["slope"] == pytest.approx(0.5)
    assert fit["rms_residual"] == pytest.approx(0, abs=1e-9)
    assert cost_report.linear_fit([1, 2, 4], [3, 6, 12])["exponent"] == pytest.approx(1)
    assert cost_report.linear_fit([1, 2, 4], [1, 4, 16])["exponent"] == pytest.approx(2)
    bent = cost_report.linear_fit([0, 1, 2], [0, 0, 3])  # best line 1.5x - 0.5; residuals 0.5, -1, 0.5
    assert bent["slope"] == pytest.approx(1.5) and bent["rms_residual"] == pytest.approx(math.sqrt(0.5))
    points = [{"axis": "trajectories", "point": size, "seconds": s} for size, s in (("16", 2.0), ("256", 36.0))]
    line = cost_report.linearity_line(points)
    assert "x18.00" in line and "OVER the 17.6 bound" in line


def test_generation_counts_a_prefilled_prompt_position_through_the_body_alone():
    breakdown = importlib.import_module("iteration_breakdown")
    # 100 body weights, a 10-weight LM head; 5 sampled tokens and 20 prompt positions prefilled in 1 s.
    params = breakdown.PolicyParameters(all=110, trained=110, body=100, head=10)
    gflops = breakdown.phase_gflops(params, row_tokens=0, computed_tokens=0, update_s=1.0,
                                    generated_tokens=5, prefilled_tokens=20, generation_s=1.0)
    assert gflops["generation_gflops"] == pytest.approx(2 * 110 * 5 / 1e9)  # 1100 FLOPs: sampled tokens only
    assert gflops["generation_computed_gflops"] == pytest.approx((2 * 110 * 5 + 2 * 100 * 20) / 1e9)  # + 4000


def test_a_tied_head_is_counted_once_in_the_policys_parameters():
    breakdown = importlib.import_module("iteration_breakdown")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shapes.SHAPES["smollm2-360m-shape"]())  # tied, 49152 x 960 head

    class Learner:
        module = {"default_policy": type("Module", (), {"policy": model})()}

    params = breakdown.policy_parameters(Learner())
    assert params.head == 49152 * 960 and params.all == 361_821_120
    assert params.body == params.all - params.head


def test_the_shaped_models_have_the_published_parameter_counts():
    for name, count in (("smollm2-360m-shape", 361_821_120), ("qwen2.5-0.5b-shape", 494_032_768)):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(shapes.SHAPES[name]())
        assert sum(p.numel() for p in model.parameters()) == count, name


def test_points_need_one_axis_and_two_iterations():
    with pytest.raises(Exception, match="--points needs exactly one --axis"):
        cost_curves.parse_args(["--points", "16"])
    with pytest.raises(Exception, match="--iters must be at least 2"):
        cost_curves.parse_args(["--iters", "1"])


def test_the_ceiling_is_read_in_its_dtype_and_older_runs_read_as_bf16():
    assert cost_curves.stored_ceiling({"ceiling_gflops": 80.0, "ceiling_dtype": "float32"}) == (80.0, "float32")
    assert cost_curves.stored_ceiling({"bf16_ceiling_gflops": 990.0}) == (990.0, "bfloat16")
    lines = cost_report.report_lines([], 80.0, "float32")
    assert lines[0] == "float32 matmul ceiling (measured once, alone, on the machine of the points): 80 GFLOP/s"


def test_a_larger_vocabulary_gets_placeholder_tokens_that_decode(tmp_path):
    """Qwen2.5's shape has 151,936 ids against SmolLM2's 49,152 tokens: every id a random model samples decodes."""
    padded, plain = tmp_path / "padded", tmp_path / "plain"
    padded.mkdir()
    plain.mkdir()
    shapes.install_tokenizer(padded, 49152 + 3)
    install_vendored_tokenizer(plain)
    tokenizer, vendored = AutoTokenizer.from_pretrained(padded), AutoTokenizer.from_pretrained(plain)
    assert len(tokenizer) == 49155 and tokenizer.decode([49154]) == "<|pad_49154|>"
    text = "<|im_start|>user\nLeft, Right<|im_end|>"
    assert tokenizer(text).input_ids == vendored(text).input_ids  # SmolLM2's own ids are unchanged
    assert tokenizer.chat_template == vendored.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert [p.name for p in padded.iterdir() if p.is_dir()] == []  # the staging folder is gone


def test_the_answer_axis_is_fitted_on_the_tokens_generated_not_the_limit():
    points = [
        {"axis": "answer", "point": limit, "answer_tokens_mean": mean, "seconds": 10 + 2 * mean}
        for limit, mean in (("32", 30.0), ("256", 150.0))
    ]
    assert [cost_report.work(p) for p in points] == [30.0, 150.0]
    assert cost_report.linear_fit([cost_report.work(p) for p in points], [p["seconds"] for p in points])[
        "slope"
    ] == pytest.approx(2)
