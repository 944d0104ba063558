"""The tests mirror the product's packages and share helpers through tests/support/ only:
a module's tests are found at its own path under tests/, and no test package depends on
another's modules (a helper two packages need is support, not one package's test code)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tests.support.imports import imported_modules
from tests.support.order import slow_files_first

pytest_plugins = ["pytester"]  # the ordering test collects a small tree of its own

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = "tests.support"
TEST_MODULE_NAMES = ("__init__.py", "conftest.py")
"""Besides test_*.py, the only files a test package holds; helpers live in tests/support/."""


def _test_directories(root: Path) -> Iterator[Path]:
    """Every directory of test packages under root/tests (support/ and caches aside), relative to root."""
    for path in sorted((root / "tests").rglob("*")):
        relative = path.relative_to(root)
        if path.is_dir() and relative.parts[:2] != ("tests", "support") and not any(
            part.startswith((".", "__")) for part in relative.parts
        ):
            yield relative


def unmirrored_directories(root: Path) -> list[str]:
    """Test directories with no product package or module at the same path: tests/server/alerts
    needs server/alerts/, tests/server/storage needs server/storage/ or server/storage.py."""
    wrong = []
    for path in _test_directories(root):
        product = root / Path(*path.parts[1:])
        if not (product.is_dir() or product.with_suffix(".py").is_file()):
            wrong.append(str(path))
    return wrong


def directories_without_init(root: Path) -> list[str]:
    """Test directories that are not packages (two test_units.py would clash on import)."""
    directories = [Path("tests"), *_test_directories(root), Path("tests", "support")]
    return [str(path) for path in directories if (root / path).is_dir() and not (root / path / "__init__.py").exists()]


def stray_modules(root: Path) -> list[str]:
    """Modules of test packages that are neither tests nor conftest.py: helpers belong in tests/support/."""
    return [
        str(path.relative_to(root))
        for directory in [Path("tests"), *_test_directories(root)]
        for path in sorted((root / directory).glob("*.py"))
        if not (path.name.startswith("test_") or path.name in TEST_MODULE_NAMES)
    ]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of_other_test_modules(root: Path) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a test module that is not tests.support: test
    modules, conftest files and helpers left in test packages included."""
    wrong = []
    for path in sorted((root / "tests").rglob("*.py")):
        names = list(dict.fromkeys(imported_modules(_module_name(root, path), path)))
        # `from tests.server import helpers` names tests.server and tests.server.helpers: report the latter
        for imported in (name for name in names if not any(other.startswith(f"{name}.") for other in names)):
            in_tests = imported == "tests" or imported.startswith("tests.")
            if in_tests and imported != SUPPORT and not imported.startswith(f"{SUPPORT}."):
                wrong.append((_module_name(root, path), imported))
    return wrong


def test_every_test_directory_mirrors_a_product_directory() -> None:
    assert unmirrored_directories(ROOT) == []


def test_every_test_directory_is_a_package() -> None:
    assert directories_without_init(ROOT) == []


def test_test_packages_hold_tests_and_conftest_only() -> None:
    assert stray_modules(ROOT) == []


def test_tests_import_no_test_module_but_support() -> None:
    assert imports_of_other_test_modules(ROOT) == []


def test_the_checks_find_what_they_forbid(tmp_path: Path) -> None:
    def write(relative: str, text: str = "") -> None:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)

    write("server/alerts/engine.py")
    write("server/storage.py")
    for package in ("tests", "tests/server", "tests/server/alerts", "tests/server/storage", "tests/server/ghost", "tests/support"):
        write(f"{package}/__init__.py")
    write("tests/server/routes/test_api.py")  # mirrored (below), but not a package
    write("server/routes/api.py")
    write("tests/support/client.py", "from tests.server.alerts import test_engine\n")
    write("tests/server/helpers.py")
    write(
        "tests/server/alerts/test_engine.py",
        "from tests.support.client import connect\n"
        "from tests.support import client\n"
        "import tests.dashboard.streams\n"
        "from tests.server import helpers\n"
        "from .conftest import fixture\n"
        "from .. import conftest\n",
    )

    assert unmirrored_directories(tmp_path) == ["tests/server/ghost"]
    assert directories_without_init(tmp_path) == ["tests/server/routes"]
    assert stray_modules(tmp_path) == ["tests/server/helpers.py"]
    assert imports_of_other_test_modules(tmp_path) == [
        ("tests.server.alerts.test_engine", "tests.dashboard.streams"),
        ("tests.server.alerts.test_engine", "tests.server.helpers"),
        ("tests.server.alerts.test_engine", "tests.server.alerts.conftest.fixture"),
        ("tests.server.alerts.test_engine", "tests.server.conftest"),
        ("tests.support.client", "tests.server.alerts.test_engine"),
    ]



def test_files_holding_a_slow_test_are_handed_out_first_and_keep_their_tests_order(pytester) -> None:  # type: ignore[no-untyped-def]
    """`make test`'s workers take files in collection order (tests/conftest.py orders them):
    a file with slow tests before any without, more slow tests first, then more tests first."""
    pytester.makepyfile(
        test_a_many="def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n",
        test_b_one="def test_1(): pass\n",
        test_c_slow="import pytest\ndef test_quick(): pass\n@pytest.mark.slow\ndef test_long(): pass\n",
        test_d_slower="import pytest\n@pytest.mark.slow\ndef test_1(): pass\n@pytest.mark.slow\ndef test_2(): pass\n",
    )
    items, _ = pytester.inline_genitems()
    slow_files_first(items)
    assert [item.nodeid for item in items] == [
        "test_d_slower.py::test_1", "test_d_slower.py::test_2",
        "test_c_slow.py::test_quick", "test_c_slow.py::test_long",
        "test_a_many.py::test_1", "test_a_many.py::test_2", "test_a_many.py::test_3",
        "test_b_one.py::test_1",
    ]  # fmt: skip
