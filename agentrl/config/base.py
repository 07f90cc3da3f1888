"""The one base of every section of the config trees: unknown keys are errors, assignments are
validated, and no float setting takes NaN or inf (a bound such as `ge=0` lets both through)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
