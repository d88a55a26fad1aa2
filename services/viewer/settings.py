"""Settings of `searchr1 view` (environment `VIEWER_…`, or a run config's `[viewer]` table)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import AuthSettings, ServiceSettings


class ViewerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="VIEWER_")
    section: ClassVar[str] = "viewer"

    host: str = "127.0.0.1"
    """Address to bind (loopback by default: the archive holds every prompt and response of the run)."""
    port: int = Field(default=8600, ge=0, le=65535)
    """Port to serve on (0 = any free port)."""
    token: str | None = None
    """Bearer token every page needs when set (health stays open). A browser passes it once as
    `?token=…`; the viewer then keeps it in a cookie for the session."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """An empty `token` makes `searchr1 view` generate one for the session (printed in the URL) unless
    `auth.insecure_no_auth` is on."""
    page_size: int = Field(default=50, ge=1, le=1000)
    """Trajectories per page of the run page's listing."""
    cache_dir: Path | None = Path.home() / ".cache" / "searchr1" / "viewer"
    """Where per-part summaries are kept between runs of the viewer (keyed by part path, size and time);
    None = memory only. The archive itself is never written."""
    compare: Path | None = None
    """A second run (or evaluation) directory whose trajectories of the same question the question page
    shows beside this run's: the before/after pair."""
    tokenizer: Path | None = None
    """A `tokenizer.json` (or a directory holding one) to decode each response token on the trajectory
    page; without it tokens show as ids."""
