"""The wire format of a StarPO env served over OpenEnv (`envs.openenv_server`), read by `envs.openenv_client`.

OpenEnv's messages carry an action and an observation as pydantic models; the
server's models are these. An action is one action phrase in `message` (the
field OpenEnv's text envs, echo and TextArena, use too). An observation is the
rendered state in `text` with what a TextEnv's `info` says: OpenEnv's `done`
is `terminated or truncated`, so `truncated` travels on its own; OpenEnv
drops an observation's `metadata` from its messages, so the env's info travels
whole in `info` (`success` and `action_is_valid` also as fields of their own,
for OpenEnv clients that read the schema).

Besides OpenEnv's routes, the server answers `GET /text_env` with the env's
instructions and action vocabulary (`TextEnvSpec`): the prompt needs both
before the first reset.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation
from pydantic import BaseModel, Field

ACTION_FIELD = "message"
OBSERVATION_FIELD = "text"
TEXT_ENV_ROUTE = "/text_env"


class TextAction(Action):
    """One action phrase, e.g. "Up"."""

    message: str = Field(description="one action phrase, e.g. 'Up' (see GET /text_env for the vocabulary)")


class TextObservation(Observation):
    """The rendered state and the step's info."""

    text: str = Field(description="the state as the text the model sees")
    truncated: bool = Field(default=False, description="the episode ended by a limit, not by the task")
    success: bool = Field(default=False, description="the task is solved")
    action_is_valid: bool = Field(default=True, description="the action was understood and legal")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info, whole (JSON values)")


class TextEnvSpec(BaseModel):
    """What `GET /text_env` answers."""

    instructions: str = Field(description="the task, symbol legend and actions (the system prompt's part)")
    action_vocabulary: list[str] | None = Field(description="the exact action names, or null for free-form actions")
