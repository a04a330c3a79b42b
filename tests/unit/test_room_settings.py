"""Each room's settings value reads its fields from the settings of their names
(`config.settings_of`), so a room declares what it reads and a rename of a setting fails at once."""

from __future__ import annotations

import dataclasses

import pytest

from queue_service.config import Config, settings_of
from queue_service.engine.admission import AdmissionSettings
from queue_service.engine.sweeper import SweeperSettings


def test_a_rooms_settings_hold_the_values_of_the_settings_of_their_names() -> None:
    config = Config.from_env({"QUEUE_ADMIT_PRICE": "3", "QUEUE_MAX_QUEUED_PER_USER": "7", "QUEUE_JOB_RETENTION_SECONDS": "7200"})
    admission = AdmissionSettings.from_config(config)
    assert (admission.admit_price, admission.max_queued_per_user) == (3, 7)
    assert all(getattr(admission, f.name) == getattr(config, f.name) for f in dataclasses.fields(admission))
    sweeper = SweeperSettings.from_config(config)
    assert sweeper.prune.job_retention_seconds == 7200  # a nested settings value, read the same way


def test_a_field_no_setting_is_named_after_fails_at_once() -> None:
    @dataclasses.dataclass(frozen=True)
    class Misnamed:
        admit_prize: int

    with pytest.raises(AttributeError, match="admit_prize"):
        settings_of(Misnamed, Config.from_env({}))
