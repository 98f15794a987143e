"""Learning curves: evaluation success with its 95% band against minutes of training, from MLflow.

Reads every finished run of the given experiments (the tuned examples and
`benchmarks/cpu_learning.py` log to MLflow) and draws one line per run: the
success on the fixed evaluation seeds before RL (minute 0) and at each
evaluation after, with its Wilson interval as a band. Writes a PNG.

    python benchmarks/learning_curve.py --tracking-uri sqlite:///mlflow.db --experiment rllib-ragen \\
        --output docs/results/learning_curve_frozenlake.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envs.user_errors import CLIParser, UserError, front_door
from rllib_ragen.run.given_paths import existing_store, output_file
from rllib_ragen.run.analysis import EVALUATION_SUCCESS, TRAINING_SECONDS, list_runs, metric_histories, plot_evaluation
from rllib_ragen.run.mlflow_store import tracking_client


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = CLIParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow tracking URI of the runs")
    parser.add_argument("--experiment", action="append", required=True, help="MLflow experiment name (repeatable)")
    parser.add_argument("--title", help="figure title (default: the experiments' names)")
    parser.add_argument("--output", type=output_file, required=True, help="PNG file to write")
    return parser.parse_args(argv)


@front_door
def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    existing_store(args.tracking_uri)
    client = tracking_client(args.tracking_uri)
    histories = {}
    for experiment in args.experiment:
        for run in list_runs(client, experiment).itertuples():
            # The run's name holds its env; the experiment tells runs apart only when there are several.
            label = f"{run.run_name} ({run.advantage_estimator})"
            if len(args.experiment) > 1:
                label = f"{experiment}: {label}"
            histories[label] = metric_histories(client, run.run_id, [*EVALUATION_SUCCESS, TRAINING_SECONDS])
    if not histories:
        raise UserError(f"no runs in experiments {args.experiment} at {args.tracking_uri}")
    figure = plot_evaluation(histories, against_minutes=True)
    figure.suptitle(args.title or ", ".join(args.experiment))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    print(f"learning curve of {len(histories)} run(s) written to {output}")
    return output


if __name__ == "__main__":
    main()
