"""Alembic is the only schema path: head matches the models exactly, on both databases."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from server.db import alembic_config, async_url, upgrade
from server.models import Base


# Migrations start from nothing here: not the conftest's databases, which are copies of one at head.
@pytest.fixture
def sqlite_url(empty_sqlite_url: str) -> str:
    return empty_sqlite_url


@pytest.fixture
def postgres_url(empty_postgres_url: str) -> str:
    return empty_postgres_url


def _sync_url(database_url: str) -> str:
    url = async_url(database_url)
    driver = "sqlite" if url.get_backend_name() == "sqlite" else "postgresql+psycopg"
    return url.set(drivername=driver).render_as_string(hide_password=False)


def test_upgrade_head_on_empty_database_matches_models(database_url: str) -> None:
    upgrade(database_url)
    engine = create_engine(_sync_url(database_url))
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= {"runs", "series", "points", "alembic_version"}
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
        upgrade(database_url)  # idempotent
    finally:
        engine.dispose()


def test_keel_db_upgrade_command(sqlite_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "db", "upgrade", "--database-url", sqlite_url],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "database at head" in result.stdout
    engine = create_engine(_sync_url(sqlite_url))
    with engine.connect() as conn:
        head = ScriptDirectory.from_config(alembic_config(sqlite_url)).get_current_head()
        assert head is not None
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head
    engine.dispose()


def test_projects_from_before_mismatch_drift_get_it_once(database_url: str) -> None:
    """0007 adds the rule to projects installed without it, not to one that has a rule of
    that name, and a second upgrade adds nothing; downgrading removes only the built-in one."""
    from alembic import command

    upgrade(database_url, "0006")
    engine = create_engine(_sync_url(database_url))
    rule_columns = "name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"
    try:
        with engine.begin() as conn:
            for project in ("old", "custom"):
                conn.exec_driver_sql(f"INSERT INTO projects (name, created_at) VALUES ('{project}', 0)")
                conn.exec_driver_sql(
                    f"INSERT INTO rules ({rule_columns}) VALUES ('collapse risk', '{project}', 'grad/norm', 'collapse_risk', '{{}}', 'critical', 1, 50, true, true, 0)"
                )
            conn.exec_driver_sql(
                f"INSERT INTO rules ({rule_columns}) VALUES ('mismatch drift', 'custom', 'mismatch/kl', 'climb', '{{}}', 'warning', 3, 30, true, false, 0)"
            )
        upgrade(database_url, "0009")  # 0010 widens the rule's metric: test_projects_from_before_the_signature_rules...
        upgrade(database_url, "0009")

        def drift() -> list[tuple]:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.exec_driver_sql(
                    "SELECT project, detector, metric, severity, builtin FROM rules WHERE name = 'mismatch drift' ORDER BY project"
                )]

        assert drift() == [("custom", "climb", "mismatch/kl", "warning", False), ("old", "co_climb", "mismatch/kl,mismatch/ratio_max", "critical", True)]
        command.downgrade(alembic_config(database_url), "0006")
        assert drift() == [("custom", "climb", "mismatch/kl", "warning", False)]
    finally:
        engine.dispose()


def test_projects_from_before_the_signature_rules_get_each_once(database_url: str) -> None:
    """0010 adds each rule on the signatures every run logs (entropy, loss, ratio, length,
    reward spread) to projects installed without it, as the catalog defines it; a project's own
    rule of the same name is kept and not doubled, a second upgrade adds nothing, and a
    downgrade removes only the built-in ones."""
    import importlib

    from alembic import command

    from server.alerts.catalog import SIGNATURE_RULES

    frozen = importlib.import_module("migrations.versions.0010_signature_rules").RULES
    floor = importlib.import_module("migrations.versions.0015_entropy_floor")
    fallback = importlib.import_module("migrations.versions.0016_signature_fallback")
    since = dict(fallback.AFTER)  # parameters later migrations moved the built-in rules to
    later = {  # added by later migrations
        importlib.import_module(f"migrations.versions.{name}").RULE["name"] for name in ("0017_loss_gated_out_rule", "0018_answers_cut_rule", "0019_entropy_start_rule")
    }
    assert fallback.BEFORE[floor.NAME] == floor.AFTER
    assert [(r["name"], r["metric"], r["detector"], since.get(r["name"], r["params"]), r["severity"], r["for_steps"], r["keep_firing_for"]) for r in frozen] == [
        (s.name, s.metric, s.detector, s.params, s.severity, s.for_steps, s.keep_firing_for) for s in SIGNATURE_RULES if s.name not in later
    ]
    assert next(r["params"] for r in frozen if r["name"] == floor.NAME) == floor.BEFORE
    upgrade(database_url, "0009")
    engine = create_engine(_sync_url(database_url))
    rule_columns = "name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"
    try:
        with engine.begin() as conn:
            for project in ("old", "custom"):
                conn.exec_driver_sql(f"INSERT INTO projects (name, created_at) VALUES ('{project}', 0)")
            conn.exec_driver_sql(
                f"INSERT INTO rules ({rule_columns}) VALUES ('loss growing', 'custom', 'loss/pg', 'threshold', '{{}}', 'warning', 3, 30, true, false, 0)"
            )
            for project, metric in (("old", "mismatch/kl"), ("custom", "mismatch/kl_k1")):  # custom: edited by its user
                conn.exec_driver_sql(
                    f"INSERT INTO rules ({rule_columns}) VALUES ('mismatch climbing', '{project}', '{metric}', 'climb', '{{}}', 'warning', 3, 30, true, true, 0)"
                )
        upgrade(database_url, "0010")
        upgrade(database_url, "0010")

        def mismatch_metrics() -> list[tuple]:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.exec_driver_sql(
                    "SELECT project, metric FROM rules WHERE name = 'mismatch climbing' ORDER BY project"
                )]

        assert mismatch_metrics() == [
            ("custom", "mismatch/kl_k1"), ("old", "mismatch/kl|mismatch/log_ratio_abs_mean|mismatch/log_ratio_abs_seq_mean"),
        ]

        def signature_rules() -> list[tuple]:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.exec_driver_sql(
                    "SELECT project, name, detector, severity, builtin FROM rules WHERE name <> 'mismatch climbing' ORDER BY project, name"
                )]

        names = sorted(spec.name for spec in SIGNATURE_RULES if spec.name not in later)
        expected_old = [("old", name, spec.detector, spec.severity, True) for name in names for spec in SIGNATURE_RULES if spec.name == name]
        expected_custom = [
            ("custom", name, spec.detector, spec.severity, True) if name != "loss growing" else ("custom", name, "threshold", "warning", False)
            for name in names for spec in SIGNATURE_RULES if spec.name == name
        ]
        assert signature_rules() == expected_custom + expected_old
        command.downgrade(alembic_config(database_url), "0009")
        assert signature_rules() == [("custom", "loss growing", "threshold", "warning", False)]
        assert mismatch_metrics() == [("custom", "mismatch/kl_k1"), ("old", "mismatch/kl")]
    finally:
        engine.dispose()


def test_the_builtin_mismatch_rules_read_a_k1_estimate_from_0014(database_url: str) -> None:
    """0014 widens the built-in mismatch rules still on their 0010 metric to the catalog's
    (a framework's k1 estimate last); a rule its user edited is kept; a downgrade narrows them."""
    from alembic import command

    from server.alerts.catalog import DEFAULT_RULES, MISMATCH_KEYS

    upgrade(database_url, "0013")
    engine = create_engine(_sync_url(database_url))
    rule_columns = "name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"
    before = "mismatch/kl|mismatch/log_ratio_abs_mean|mismatch/log_ratio_abs_seq_mean"
    try:
        with engine.begin() as conn:
            for project in ("old", "custom"):
                conn.exec_driver_sql(f"INSERT INTO projects (name, created_at) VALUES ('{project}', 0)")
            for project, metric in (("old", before), ("custom", "mismatch/kl")):  # custom: edited by its user
                conn.exec_driver_sql(
                    f"INSERT INTO rules ({rule_columns}) VALUES ('mismatch climbing', '{project}', '{metric}', 'climb', '{{}}', 'warning', 3, 30, true, true, 0)"
                )
            conn.exec_driver_sql(
                f"INSERT INTO rules ({rule_columns}) VALUES ('mismatch drift', 'old', '{before},mismatch/ratio_max', 'co_climb', '{{}}', 'critical', 1, 50, true, true, 0)"
            )

        def metrics() -> list[tuple]:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.exec_driver_sql("SELECT name, project, metric FROM rules ORDER BY name, project")]

        upgrade(database_url, "0014")
        catalog = {rule.name: rule.metric for rule in DEFAULT_RULES}
        assert MISMATCH_KEYS.endswith("|mismatch/kl_k1")
        assert metrics() == [
            ("mismatch climbing", "custom", "mismatch/kl"),
            ("mismatch climbing", "old", catalog["mismatch climbing"]),
            ("mismatch drift", "old", catalog["mismatch drift"]),
        ]
        command.downgrade(alembic_config(database_url), "0013")
        assert metrics() == [
            ("mismatch climbing", "custom", "mismatch/kl"),
            ("mismatch climbing", "old", before),
            ("mismatch drift", "old", f"{before},mismatch/ratio_max"),
        ]
    finally:
        engine.dispose()



def _project_with_one_run(conn: Any) -> None:
    """Project 'p' with one running run 'r1', for rule states to belong to."""
    conn.exec_driver_sql("INSERT INTO projects (name, created_at) VALUES ('p', 0)")
    conn.exec_driver_sql(
        "INSERT INTO runs (id, name, project, config, tags, status, acked_seq, started_at, last_seen_at) "
        "VALUES ('r1', 'r1', 'p', '{}', '[]', 'running', -1, 0, 0)"
    )


def _rules_and_states(engine: Any) -> dict[int, tuple[dict, dict]]:
    """Each rule's parameters and its one run's stored state, by rule id (JSON read back)."""
    import json

    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT r.id, r.params, s.state FROM rules r JOIN rule_states s ON s.rule_id = r.id").all()
    return {row[0]: tuple(json.loads(v) if isinstance(v, str) else v for v in row[1:]) for row in rows}

def test_the_builtin_entropy_rule_takes_the_floor_of_0015_and_its_runs_keep_their_level(database_url: str) -> None:
    """0015 moves the built-in "entropy running away" rules still on their 0010 parameters to the
    catalog's floor (0.2 nats); each run's detector state is read under the new floor and marked
    as computed for the new parameters (the engine keeps it: the run keeps its learned level);
    a rule its user edited, and its state, are left alone; a downgrade puts the old floor back."""
    import importlib
    import json
    import math
    from types import SimpleNamespace

    from alembic import command

    from server.alerts.catalog import SIGNATURE_RULES
    from server.alerts.state import definition

    spec = next(rule for rule in SIGNATURE_RULES if rule.name == "entropy running away")
    before = importlib.import_module("migrations.versions.0015_entropy_floor").BEFORE
    edited = {**before, "k": 3.0}
    upgrade(database_url, "0014")
    engine = create_engine(_sync_url(database_url))
    rule_columns = "id, name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"

    def rule(params: dict) -> Any:  # what `definition` reads of a rule
        return SimpleNamespace(detector=spec.detector, metric=spec.metric, params=params)

    def stored(params: dict, median: float) -> str:
        detector = {"median": median, "scale": 0.35, "cusum": 0.0, "key": "policy/entropy"}
        return json.dumps({"detector": detector, "definition": definition(rule(params)), "lifecycle": {}, "alert_id": None})

    try:
        with engine.begin() as conn:
            _project_with_one_run(conn)
            for rule_id, project, params in ((1, "p", before), (2, "p", edited)):
                conn.exec_driver_sql(
                    f"INSERT INTO rules ({rule_columns}) VALUES ({rule_id}, '{spec.name}', '{project}', '{spec.metric}', 'climb', "
                    f"'{json.dumps(params)}', 'critical', 1, 50, true, true, 0)"
                )
                state = stored(params, math.log(0.1)).replace("'", "''")
                conn.exec_driver_sql(f"INSERT INTO rule_states (rule_id, run_id, state, last_step) VALUES ({rule_id}, 'r1', '{state}', 10)")

        upgrade(database_url, "0015")
        after = {**before, "floor": 0.2}
        moved, kept = _rules_and_states(engine)[1], _rules_and_states(engine)[2]
        assert moved[0] == after and spec.params["floor"] == 0.2
        assert moved[1]["definition"] == definition(rule(after))  # the engine keeps this state
        assert moved[1]["detector"]["median"] == math.log(0.2) and moved[1]["detector"]["scale"] == 0.35
        assert kept[0] == edited and kept[1]["detector"]["median"] == math.log(0.1)
        assert kept[1]["definition"] == definition(rule(edited))
        command.downgrade(alembic_config(database_url), "0014")
        back = _rules_and_states(engine)[1]
        assert back[0] == before and back[1]["definition"] == definition(rule(before))
        assert back[1]["detector"]["median"] == math.log(0.2)  # a floored level is not lowered again
    finally:
        engine.dispose()


def test_the_builtin_entropy_and_loss_rules_take_the_fallback_of_0016_and_keep_their_states(database_url: str) -> None:
    """0016 gives the built-in "entropy running away" and "loss growing" rules still on their
    earlier parameters the catalog's `fallback`; each run's state is kept and marked as computed
    for the new parameters; an edited rule is left alone; a downgrade takes the parameter off."""
    import importlib
    import json
    from types import SimpleNamespace

    from alembic import command

    from server.alerts.catalog import SIGNATURE_RULES
    from server.alerts.state import definition

    frozen = importlib.import_module("migrations.versions.0016_signature_fallback")
    specs = {rule.name: rule for rule in SIGNATURE_RULES if rule.name in frozen.BEFORE}
    assert sorted(specs) == sorted(frozen.BEFORE) and all(specs[name].params == frozen.AFTER[name] for name in specs)
    upgrade(database_url, "0015")
    engine = create_engine(_sync_url(database_url))
    rule_columns = "id, name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"

    def rule(name: str, params: dict) -> Any:  # what `definition` reads of a rule
        return SimpleNamespace(detector="climb", metric=specs[name].metric, params=params)

    rows = [(1, "entropy running away", frozen.BEFORE["entropy running away"]), (2, "loss growing", frozen.BEFORE["loss growing"]),
            (3, "loss growing", {**frozen.BEFORE["loss growing"], "h": 20.0})]
    try:
        with engine.begin() as conn:
            _project_with_one_run(conn)
            for rule_id, name, params in rows:
                conn.exec_driver_sql(
                    f"INSERT INTO rules ({rule_columns}) VALUES ({rule_id}, '{name}', 'p', '{specs[name].metric}', 'climb', "
                    f"'{json.dumps(params)}', 'critical', 1, 50, true, true, 0)"
                )
                state = json.dumps({"detector": {"median": 0.5, "scale": 0.35, "cusum": 1.5}, "definition": definition(rule(name, params)),
                                    "lifecycle": {}, "alert_id": None})
                conn.exec_driver_sql(f"INSERT INTO rule_states (rule_id, run_id, state, last_step) VALUES ({rule_id}, 'r1', '{state}', 10)")

        upgrade(database_url, "0016")
        now = _rules_and_states(engine)
        for rule_id, name, _ in rows[:2]:
            assert now[rule_id][0] == {**frozen.BEFORE[name], "fallback": 100}
            assert now[rule_id][1]["definition"] == definition(rule(name, now[rule_id][0]))  # the engine keeps it
            assert now[rule_id][1]["detector"] == {"median": 0.5, "scale": 0.35, "cusum": 1.5}
        assert now[3][0] == rows[2][2] and now[3][1]["definition"] == definition(rule("loss growing", rows[2][2]))
        command.downgrade(alembic_config(database_url), "0015")
        back = _rules_and_states(engine)
        for rule_id, name, params in rows:
            assert back[rule_id][0] == params and back[rule_id][1]["definition"] == definition(rule(name, params))
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("module", "before"),
    [("0017_loss_gated_out_rule", "0016"), ("0018_answers_cut_rule", "0017"), ("0019_entropy_start_rule", "0018")],
    ids=["0017", "0018", "0019"],
)
def test_projects_from_before_a_later_default_rule_get_it_once(database_url: str, module: str, before: str) -> None:
    """0017 adds "loss gated out", 0018 "answers cut at the cap", 0019 "entropy far above its
    start", each as the catalog defines
    it, to every project that has no rule of that name (a project's own rule of that name is
    kept, not doubled); a second upgrade adds nothing; a downgrade removes only the built-in one."""
    import importlib

    from alembic import command

    from server.alerts.catalog import SIGNATURE_RULES

    frozen = importlib.import_module(f"migrations.versions.{module}").RULE
    revision = module[:4]
    spec = next(rule for rule in SIGNATURE_RULES if rule.name == frozen["name"])
    moved = importlib.import_module("migrations.versions.0020_answers_cut_reward_fall")  # parameters moved since
    since = moved.AFTER if frozen["name"] == moved.NAME and frozen["params"] == moved.BEFORE else frozen["params"]
    assert (frozen["metric"], frozen["detector"], since, frozen["severity"], frozen["for_steps"], frozen["keep_firing_for"]) == (
        spec.metric, spec.detector, spec.params, spec.severity, spec.for_steps, spec.keep_firing_for
    )
    upgrade(database_url, before)
    engine = create_engine(_sync_url(database_url))
    rule_columns = "name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"

    def installed() -> list[tuple]:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(
                text("SELECT project, metric, detector, severity, for_steps, builtin FROM rules WHERE name = :name ORDER BY project"),
                {"name": spec.name},
            )]

    own = ("custom", spec.metric, "threshold", "critical", 5, False)
    try:
        with engine.begin() as conn:
            for project in ("old", "custom"):
                conn.exec_driver_sql(f"INSERT INTO projects (name, created_at) VALUES ('{project}', 0)")
            conn.execute(
                text(f"INSERT INTO rules ({rule_columns}) VALUES (:name, 'custom', :metric, 'threshold', "
                     "'{\"threshold\": 0.5}', 'critical', 5, 30, true, false, 0)"),
                {"name": spec.name, "metric": spec.metric},
            )
        upgrade(database_url, revision)
        upgrade(database_url, revision)
        assert installed() == [own, ("old", spec.metric, spec.detector, spec.severity, spec.for_steps, True)]
        command.downgrade(alembic_config(database_url), before)
        assert installed() == [own]
    finally:
        engine.dispose()


def test_the_builtin_answers_cut_rule_takes_the_reward_fall_of_0020_and_an_edited_one_is_left(database_url: str) -> None:
    """0020 gives the built-in "answers cut at the cap" rules still on their 0018 parameters the
    catalog's `reward_fall`; a rule its user edited, or one that is not built in, is left alone;
    a downgrade takes the parameter off."""
    import importlib
    import json

    from alembic import command

    from server.alerts.catalog import SIGNATURE_RULES

    frozen = importlib.import_module("migrations.versions.0020_answers_cut_reward_fall")
    spec = next(rule for rule in SIGNATURE_RULES if rule.name == frozen.NAME)
    assert spec.params == frozen.AFTER
    upgrade(database_url, "0019")
    engine = create_engine(_sync_url(database_url))
    rule_columns = "id, name, project, metric, detector, params, severity, for_steps, keep_firing_for, enabled, builtin, created_at"
    rows = [(1, frozen.BEFORE, True), (2, {**frozen.BEFORE, "threshold": 0.95}, True), (3, frozen.BEFORE, False)]

    def params() -> dict[int, Any]:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT id, params FROM rules ORDER BY id")).all()
        return {rule_id: value if isinstance(value, dict) else json.loads(value) for rule_id, value in found}

    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO projects (name, created_at) VALUES ('p', 0)")
            for rule_id, values, builtin in rows:
                conn.exec_driver_sql(
                    f"INSERT INTO rules ({rule_columns}) VALUES ({rule_id}, '{frozen.NAME}', 'p', '{spec.metric}', 'threshold', "
                    f"'{json.dumps(values)}', 'critical', 1, 10, true, {str(builtin).lower()}, 0)"
                )
        upgrade(database_url, "0020")
        assert params() == {1: frozen.AFTER, 2: rows[1][1], 3: frozen.BEFORE}
        command.downgrade(alembic_config(database_url), "0019")
        assert params() == {1: frozen.BEFORE, 2: rows[1][1], 3: frozen.BEFORE}
    finally:
        engine.dispose()
