"""A profile point whose trainer ran clean and wrote no profile.json. The phase exists to profile,
so such a point measured nothing it was run for: it is UNMEASURED whatever its gates
(judge/verdict.py ``clean_verdict``), never a PASS, and a finding names it. What it says depends on
the trainer: one that gives its reason in env.json's ``profile`` note (this project's trainer: a run
that ends before its first steady step) is quoted; one that says nothing did not honour the
request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nsa.contract import ENV_PROFILE, PROFILE_JSON, PROFILE_STEPS_ENV


@dataclass(frozen=True)
class NoProfile:
    """What a profile point asked of its trainer, and what the trainer said of the profile it did
    not write."""

    asked: int
    """The steps ``CONTRACT_PROFILE_STEPS`` asked the trainer to profile."""
    note: str = ""
    """env.json's ``profile`` note: why the trainer wrote none ('' where it said nothing)."""

    @property
    def explained(self) -> bool:
        """The trainer said why: it read the request and could not profile, rather than ignoring it."""
        return bool(self.note)

    def text(self) -> str:
        """Why the point measured no profile, for its reason, its gates' notes and its finding."""
        if self.explained:
            return (f"no {PROFILE_JSON}: the trainer profiled none of the {self.asked} step(s) {PROFILE_STEPS_ENV} "
                    f"asked for, and says why in env.json's {ENV_PROFILE}: {self.note}")
        return (f"the trainer wrote no {PROFILE_JSON} although {PROFILE_STEPS_ENV}={self.asked} asked for one: "
                "it does not honour the request")

    @classmethod
    def of(cls, asked: int, env: Mapping[str, Any] | None) -> NoProfile:
        """The request's steps and the trainer's env.json (None where it wrote none)."""
        said = (env or {}).get(ENV_PROFILE)
        note = said.get("note") if isinstance(said, dict) else None
        return cls(asked, note.strip() if isinstance(note, str) else "")
