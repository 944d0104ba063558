"""The Docker image as shipped, without Docker: what the Dockerfile copies, installed its way
in a fresh venv, runs the stack of docker-compose.yml (migrate, then the server) on a real
PostgreSQL database. Everything is read from the Dockerfile and the compose file, so a
package the image forgets to copy, or a command the compose file names that the image's
`keel` lacks, fails here. The image is the `.[server]` install profile: no torch, no learners."""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.installs import (
    ROOT,
    Dockerfile,
    copy_image_files,
    fresh_venv,
    listed_commands,
    pip_install,
    product_env,
    read_dockerfile,
)
from tests.support.local_server import free_port
from tests.support.server import ServerProcess

COMPOSE_PORT = "8750"
"""The port the compose file serves on; each run here substitutes a free one."""
SERVER_COMMANDS = {"serve", "db", "token", "prune", "backtest"}
LEARNER_COMMANDS = {"grid", "sim", "lm", "lm-grid", "lm-corpus", "demo", "eval-alerts"}


@dataclass
class Image:
    dockerfile: Dockerfile
    workdir: Path
    venv: Path
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        return product_env(self.venv, self.home, **self.dockerfile.env, **extra)

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=self.workdir, env=self.env(**(env or {})), capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    dockerfile = read_dockerfile(ROOT / "Dockerfile")
    assert dockerfile.pip_installs, "the Dockerfile installs nothing"
    rootfs = tmp_path_factory.mktemp("rootfs")
    copy_image_files(dockerfile, ROOT, rootfs)
    venv = fresh_venv(tmp_path_factory.mktemp("image") / "venv")
    for workdir, args in dockerfile.pip_installs:
        pip_install(venv, args, cwd=rootfs / workdir.lstrip("/"))
    return Image(dockerfile, rootfs / dockerfile.workdir.lstrip("/"), venv, tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def _interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?error}."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, argument = match[1], match[2], match[3]
        if variables.get(name):
            return variables[name]
        assert operator != ":?", f"compose would refuse to start: {argument}"
        return argument if operator == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", substitute, value)


def _service_env(service: dict[str, Any], variables: dict[str, str], database_url: str, port: int) -> dict[str, str]:
    """The service's environment with this run's database (on the compose file's postgres
    service: a PostgreSQL URL) and port."""
    env = {name: _interpolate(str(value), variables).replace(COMPOSE_PORT, str(port)) for name, value in service["environment"].items()}
    assert env["KEEL_DATABASE_URL"].startswith("postgresql://"), env
    env["KEEL_DATABASE_URL"] = database_url
    return env


def _with_port(argv: list[str], port: int) -> list[str]:
    return [arg.replace(COMPOSE_PORT, str(port)) for arg in argv]


def _healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    return list(test[1:]) if test[0] == "CMD" else shlex.split(test[1])


def _documented_keel_commands(compose_text: str) -> list[list[str]]:
    """`keel ...` commands the compose file's comments tell operators to run (`docker compose exec server keel ...`)."""
    return [shlex.split(command) for command in re.findall(r"`(?:docker compose exec \S+ )?(keel [^`]+)`", compose_text)]


@pytest.mark.slow
@pytest.mark.postgres
def test_the_compose_stack_runs_on_the_image(
    image: Image, compose: dict[str, Any], empty_postgres_url: str, tmp_path: Path
) -> None:
    services = compose["services"]
    port = free_port()
    admin_token = secrets.token_urlsafe(32)
    variables = {"KEEL_ADMIN_TOKEN": admin_token}
    assert f"127.0.0.1:{COMPOSE_PORT}:{COMPOSE_PORT}" in services["server"]["ports"]

    migrate = image.run(services["migrate"]["command"], _service_env(services["migrate"], variables, empty_postgres_url, port))
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    assert "database at head" in migrate.stdout

    server_env = _service_env(services["server"], variables, empty_postgres_url, port)
    assert server_env["KEEL_MIGRATE_ON_START"] == "false" and server_env["KEEL_BOOTSTRAP_TOKEN"] == admin_token
    assert server_env["KEEL_PUBLIC_URL"] == f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    server_argv = _with_port(services["server"]["command"], port)
    with ServerProcess(server_argv, port, log, env=image.env(**server_env), cwd=image.workdir) as server:
        url = server.url
        health = image.run(_with_port(_healthcheck_argv(services["server"]), port))
        assert health.returncode == 0, health.stderr

        admin = {"Authorization": f"Bearer {admin_token}"}
        assert httpx.get(f"{url}/api/v1/runs", timeout=10).status_code == 401
        listed = httpx.get(f"{url}/api/v1/runs", headers=admin, timeout=10)
        assert listed.status_code == 200 and listed.json() == []
        assert httpx.get(f"{url}/api/v1/webhooks", headers=admin, timeout=10).status_code == 200

        # The narrower token the compose file's comment tells operators to create.
        [token_command] = [argv for argv in _documented_keel_commands((ROOT / "docker-compose.yml").read_text()) if argv[1] == "token"]
        created = image.run(token_command, server_env)
        assert created.returncode == 0, created.stdout + created.stderr
        ingest = {"Authorization": f"Bearer {created.stdout.splitlines()[0]}"}
        assert httpx.get(f"{url}/api/v1/runs", headers=ingest, timeout=10).status_code == 401  # not read
        write = httpx.post(f"{url}/api/v1/runs/{uuid.uuid4()}/points", json={"rows": []}, headers=ingest, timeout=10)
        assert write.status_code == 404, write.text  # let in, and told the run is unknown
    assert "serving on http://0.0.0.0:" in log.read_text()


def test_every_keel_command_the_image_is_run_with_exists_in_it(image: Image, compose: dict[str, Any]) -> None:
    """The Dockerfile's CMD, the compose services' commands and healthchecks, and the commands
    its comments document: each parses in the image's own `keel` (names, options, choices)."""
    services = compose["services"].values()
    argvs = [image.dockerfile.cmd]
    argvs += [service["command"] for service in services if "command" in service]
    argvs += [_healthcheck_argv(service) for service in services if "healthcheck" in service]
    argvs += _documented_keel_commands((ROOT / "docker-compose.yml").read_text())
    keel_argvs = [argv for argv in argvs if argv[0] == "keel"]
    assert {argv[1] for argv in keel_argvs} >= {"serve", "db", "token"}, keel_argvs
    assert (image.venv / "bin" / "keel").is_file()
    parse = "import sys; from keel.cli import build_parser; print(build_parser().parse_args(sys.argv[1:]).command)"
    for argv in keel_argvs:
        parsed = image.run(["python", "-I", "-c", parse, *argv[1:]])
        assert parsed.returncode == 0 and parsed.stdout.strip() == argv[1], (argv, parsed.stderr)


def test_the_image_is_the_server_profile(image: Image) -> None:
    """`.[server]`: the server's commands, no torch, no learners, and a `keel --help` that says so."""
    absent = image.run(["python", "-I", "-c", "import importlib.util as u; print([m for m in ('torch', 'learners') if u.find_spec(m)])"])
    assert absent.stdout.strip() == "[]", absent.stdout + absent.stderr
    help_result = image.run(["keel", "--help"])
    assert help_result.returncode == 0, help_result.stderr
    listed = listed_commands(help_result.stdout)
    assert listed >= SERVER_COMMANDS | {"sync", "import", "export", "watch", "parity", "run"}
    assert not listed & LEARNER_COMMANDS
    demo = image.run(["keel", "demo"])
    assert demo.returncode == 2 and "keel demo: not in this install: needs torch" in demo.stderr, demo.stderr


def test_the_image_copy_is_the_dockerfiles_copy_set_less_dockerignore(tmp_path: Path) -> None:
    """The reader this file relies on: COPY forms, WORKDIR, ENV, the pip install in a RUN, and
    .dockerignore's rules (`**`, last match wins, `!` re-includes)."""
    context = tmp_path / "context"
    for path in ("pkg/a.py", "pkg/__pycache__/a.pyc", "pkg/sub/secret.key", "pkg/sub/secret_ok.key", "one.toml", "two.md", "left.txt"):
        (context / path).parent.mkdir(parents=True, exist_ok=True)
        (context / path).write_text(path)
    (context / ".dockerignore").write_text("# comment\n**/__pycache__\npkg/*/secret*\n!pkg/sub/secret_ok.key\nleft.txt\n")
    (context / "Dockerfile").write_text(textwrap.dedent(
        """
        FROM python:3.11-slim
        ENV A=1 B="two words"
        WORKDIR /app
        COPY one.toml two.md ./
        COPY --chown=1000 pkg pkg
        COPY ["one.toml", "/etc/renamed.toml"]
        RUN apt-get update && pip install --no-cache-dir \\
            ".[server]" && useradd keel
        CMD ["keel", "serve"]
        """
    ))  # fmt: skip
    dockerfile = read_dockerfile(context / "Dockerfile")
    assert dockerfile.env == {"A": "1", "B": "two words"} and dockerfile.workdir == "/app"
    assert dockerfile.pip_installs == [("/app", ["--no-cache-dir", ".[server]"])]
    assert dockerfile.cmd == ["keel", "serve"]
    rootfs = tmp_path / "rootfs"
    copy_image_files(dockerfile, context, rootfs)
    copied = sorted(path.relative_to(rootfs).as_posix() for path in rootfs.rglob("*") if path.is_file())
    assert copied == ["app/one.toml", "app/pkg/a.py", "app/pkg/sub/secret_ok.key", "app/two.md", "etc/renamed.toml"]

    (context / "Dockerfile").write_text("FROM python:3.11-slim\nCOPY left.txt /\n")
    with pytest.raises(AssertionError, match="left out by .dockerignore"):
        copy_image_files(read_dockerfile(context / "Dockerfile"), context, tmp_path / "rootfs2")
