"""runtime.config: one configuration built from the settings, rebuilt when one changes,
with no defaults but settings.py's, and the only reader of settings besides Django's own places."""
from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest
from django.test import override_settings

from runtime import config as runtime_config
from runtime.config import Config, backend_path, config, derived

ROOT = Path(__file__).resolve().parents[1]
# Besides the configuration: the settings module itself, models naming
# AUTH_USER_MODEL and their migrations (Django's way to name the user model),
# and the format module Django reads the date formats from.
READ_SETTINGS_ALSO = {"owllayer_site/formats/en/formats.py", "aitp/models.py", "approvals/models.py",
                      "tenants/models.py"}


def parts(kind: type = Config) -> list[type]:
    """Every dataclass the configuration is made of, itself included."""
    found = [kind]
    for field in dataclasses.fields(kind):
        hint = typing.get_type_hints(kind)[field.name]
        if dataclasses.is_dataclass(hint):
            found += parts(hint)
    return found


def test_the_configuration_is_built_once_and_shared():
    assert config() is config()


def test_a_changed_setting_rebuilds_the_configuration(settings):
    before = config()
    settings.OWLLAYER_MAX_TOOL_ROUNDS = before.agent.max_tool_rounds + 1
    assert config() is not before
    assert config().agent.max_tool_rounds == before.agent.max_tool_rounds + 1


def test_leaving_override_settings_brings_the_setting_back():
    before = config().limits.frames_per_second
    with override_settings(OWLLAYER_FRAMES_PER_SECOND=before + 7):
        assert config().limits.frames_per_second == before + 7
    assert config().limits.frames_per_second == before


def test_what_is_derived_from_the_configuration_is_made_again_after_a_change(settings):
    made = []

    @derived
    def heartbeat_twice() -> float:
        made.append(1)
        return 2 * config().store.heartbeat_interval

    first = heartbeat_twice()
    assert heartbeat_twice() == first and len(made) == 1
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 4.0
    assert heartbeat_twice() == 8.0 and len(made) == 2


def test_no_part_has_a_default_of_its_own():
    defaulted = [f"{kind.__name__}.{field.name}" for kind in parts() for field in dataclasses.fields(kind)
                 if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING]
    assert len(parts()) > 10
    assert defaulted == []


def test_the_parts_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        config().agent.model = "another"  # type: ignore[misc]


def test_a_backend_is_a_name_from_the_sites_table_or_a_dotted_path():
    table = {"offline": "llm.offline.OfflineBackend"}
    assert backend_path("offline", table) == "llm.offline.OfflineBackend"
    assert backend_path("shop.llm.Mine", table) == "shop.llm.Mine"
    with pytest.raises(ValueError, match="unknown backend 'other'"):
        backend_path("other", table)


def test_the_llm_part_names_the_backend_the_setting_stands_for(settings):
    settings.OWLLAYER_LLM = "offline"
    assert (config().llm.name, config().llm.backend) == ("offline", "llm.offline.OfflineBackend")
    settings.OWLLAYER_LLM = "llm.offline.OfflineBackend"
    assert config().llm.backend == "llm.offline.OfflineBackend"


def test_the_backend_given_by_dotted_path_is_the_one_a_turn_gets(settings):
    from llm import get_backend, reset_backend
    from llm.offline import OfflineBackend

    reset_backend()
    try:
        settings.OWLLAYER_LLM = "llm.offline.OfflineBackend"
        assert isinstance(get_backend(), OfflineBackend)
    finally:
        reset_backend()


def test_settings_are_read_only_by_the_configuration_and_djangos_own_places():
    readers = set()
    for package in ("aitp", "approvals", "console", "operators", "tenants", "demo", "owllayer_site", "runtime",
                    "llm", "speech"):
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue
            tree = ast.parse(path.read_text(), filename=relative)
            if any(isinstance(node, ast.ImportFrom) and node.module == "django.conf"
                   and any(alias.name == "settings" for alias in node.names) for node in ast.walk(tree)):
                readers.add(relative)
    assert readers == {"runtime/config.py", *READ_SETTINGS_ALSO}


def test_the_module_keeps_one_configuration_at_a_time():
    current = config()
    runtime_config.rebuild()
    assert config() is not current and config() == current
