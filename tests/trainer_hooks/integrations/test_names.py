"""The shared name maps: every mapped name is one the framework's source logs (copied
verbatim, tests/support/framework_names.py; checked against the installed verl and TRL),
`auto` recognises each framework from its names, and the native integrations use the maps."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.framework_names import LOGGED, OLD
from trainer_hooks.integrations.names import FRAMEWORKS, MAPS, detect_framework


def test_every_framework_has_a_map_citing_its_pinned_source() -> None:
    assert set(FRAMEWORKS) == {"verl", "trl", "openrlhf", "prime-rl", "areal", "slime", "skyrl", "nemo-rl"}
    assert set(LOGGED) == set(FRAMEWORKS) - {"openrlhf"}  # its names: tests/trainer_hooks/integrations/test_openrlhf.py
    for name_map in MAPS.values():
        assert name_map.source and name_map.entries
        for entry in name_map.entries.values():
            assert ".py" in entry.where and entry.means


@pytest.mark.parametrize("framework", sorted(LOGGED))
def test_mapped_names_are_the_ones_the_source_logs(framework: str) -> None:
    logged = {name for name, *_ in LOGGED[framework]}
    name_map = MAPS[framework]
    cited = [name for name in name_map.entries if name in logged]
    assert cited, framework
    # Every name the fixture copies that the map maps goes where the map says; the rest keep the prefix.
    for name in logged:
        keel = name_map.keel_name(name, beside=logged)  # the pinned release logs these together
        if name in name_map.entries:
            assert keel == name_map.entries[name].keel
        elif name not in name_map.step_keys:
            assert keel.startswith(f"{name_map.prefix}/"), (name, keel)
    found, why = detect_framework(logged)
    assert found == framework, why


def _installed_file(relative: str) -> Path | None:
    package = relative.split("/")[0]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent / relative


@pytest.mark.parametrize("framework", ["verl", "trl"])
def test_the_copied_lines_are_in_the_installed_package(framework: str) -> None:
    for name, where, line, _how in LOGGED[framework]:
        relative, number = where.rsplit(":", 1)
        path = _installed_file(relative)
        if path is None:
            pytest.skip(f"{relative.split('/')[0]} is not installed")
        lines = path.read_text().splitlines()
        assert lines[int(number) - 1].strip() == line, (name, where)


def test_an_old_release_name_lands_where_its_current_name_does() -> None:
    aliased = {(framework, name) for framework, name_map in MAPS.items() for name in name_map.aliases}
    assert aliased == {(framework, name) for framework, rows in OLD.items() for name, *_ in rows}
    for framework, old in aliased:
        name_map = MAPS[framework]
        current = name_map.aliases[old].current
        assert old not in name_map.entries and old not in name_map.not_mapped
        assert name_map.keel_name(old) == name_map.keel_name(current) == name_map.entries[current].keel
        assert name_map.to_keel()[old] == name_map.entries[current].keel
        native = name_map.to_keel(native=True)
        assert old.removeprefix(name_map.log_prefix) not in native  # the pinned release logs the current name
        # Logged beside its current name, the old name's number keeps the framework's prefix.
        assert name_map.keel_name(old, beside={old, current}) == name_map.keel_name(f"{old}-unmapped").replace("-unmapped", "")
    assert MAPS["trl"].keel_name("train/completion_length") == "response/length_mean"  # TRL 0.14-0.16
    # verl <= 0.4.0 logged the entropy only as actor/entropy_loss; 0.9.1 logs it beside actor/entropy.
    assert MAPS["verl"].keel_name("actor/entropy_loss") == "policy/entropy"
    assert MAPS["verl"].keel_name("actor/entropy_loss", beside={"actor/entropy", "actor/entropy_loss"}) == "verl/actor/entropy_loss"


def test_names_of_no_framework_or_of_two_are_not_guessed() -> None:
    assert detect_framework({"loss", "accuracy"}) == (None, "no framework's names among the logged ones")
    framework, why = detect_framework({"rollout_corr/k3_kl", "mismatch_kl/all/mean"})
    assert framework is None and "several" in why


def test_native_integrations_use_the_shared_maps() -> None:
    from trainer_hooks.integrations.openrlhf import OPENRLHF_TO_KEEL
    from trainer_hooks.integrations.verl import VERL_TO_KEEL

    assert VERL_TO_KEEL == MAPS["verl"].to_keel(native=True)
    assert OPENRLHF_TO_KEEL == MAPS["openrlhf"].to_keel(native=True)
    trl_native = MAPS["trl"].to_keel(native=True)
    assert trl_native["grad_norm"] == "grad/norm" and "reward" not in trl_native  # TRL's callback computes reward/mean
    assert MAPS["trl"].keel_name("train/reward") == "reward/mean"
    assert MAPS["trl"].keel_name("train/completions/mean_length") == "response/length_mean"
    assert MAPS["trl"].keel_name("train/completions/mean_terminated_length") == "trl/completions/mean_terminated_length"
    assert "sampling/sampling_logp_difference/mean" not in trl_native  # the callback measures the mismatch itself
