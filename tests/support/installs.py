"""Keel installed as it ships, in fresh venvs, from copies of the tree (nothing imported from the
checkout): the Docker image's install read from the Dockerfile (its COPY set, honouring
.dockerignore, and its `pip install`), and the pip profiles of pyproject.toml."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a checkout holds that no install reads (a clean clone has none of it but .git).
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".*_cache")


@dataclass
class Dockerfile:
    """What a single-stage Dockerfile does to the image's file system and environment."""

    copies: list[tuple[list[str], str]] = field(default_factory=list)
    """(sources in the build context, absolute destination as written: a trailing / kept)."""
    env: dict[str, str] = field(default_factory=dict)
    pip_installs: list[tuple[str, list[str]]] = field(default_factory=list)
    """(working directory, the arguments after `pip install`), in order."""
    workdir: str = "/"
    """The final WORKDIR: where CMD and compose commands run."""
    cmd: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuation lines joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (keyword.upper(), rest.strip())
        for keyword, _, rest in (line.strip().partition(" ") for line in joined.splitlines() if line.strip())
    ]


def read_dockerfile(path: Path) -> Dockerfile:
    """The COPY, ENV, WORKDIR, pip install (in RUN) and CMD of a single-stage Dockerfile."""
    dockerfile = Dockerfile()
    instructions = _instructions(path.read_text())
    assert [keyword for keyword, _ in instructions].count("FROM") == 1, "a multi-stage build: extend this reader"
    for keyword, rest in instructions:
        if keyword == "WORKDIR":
            dockerfile.workdir = posixpath.join(dockerfile.workdir, rest)
        elif keyword == "ENV":
            for assignment in shlex.split(rest):
                name, equals, value = assignment.partition("=")
                assert equals, f"ENV {rest}: only the name=value form is read here"
                dockerfile.env[name] = value
        elif keyword == "COPY":
            words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            flags = [word for word in words if word.startswith("--")]
            assert all(flag.startswith("--chown") or flag.startswith("--chmod") for flag in flags), flags
            *sources, destination = [word for word in words if not word.startswith("--")]
            absolute = posixpath.join(dockerfile.workdir, destination)
            dockerfile.copies.append((sources, absolute + "/" if destination.endswith("/") else absolute))
        elif keyword == "RUN":
            for command in re.split(r"&&|;", rest):
                words = shlex.split(command)
                for prefix in (["pip", "install"], ["python", "-m", "pip", "install"]):
                    if words[: len(prefix)] == prefix:
                        dockerfile.pip_installs.append((dockerfile.workdir, words[len(prefix) :]))
        elif keyword == "CMD":
            dockerfile.cmd = json.loads(rest)
    return dockerfile


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus `**`) as a regex over a relative path."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1 : end].replace("!", "^", 1) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def dockerignore(context: Path) -> Callable[[str], bool]:
    """Whether a path (relative, /-separated) is left out of the build context: as Docker does,
    the last rule that matches the path or one of its parents decides, `!` re-includes."""
    ignore_file = context / ".dockerignore"
    rules = []
    for line in ignore_file.read_text().splitlines() if ignore_file.exists() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        rules.append((keep, _glob_regex(posixpath.normpath(line.lstrip("!").strip().lstrip("/")))))

    def excluded(relative: str) -> bool:
        parts = relative.split("/")
        paths = ["/".join(parts[: depth + 1]) for depth in range(len(parts))]
        verdict = False
        for keep, regex in rules:
            if any(regex.fullmatch(path) for path in paths):
                verdict = not keep
        return verdict

    return excluded


def copy_image_files(dockerfile: Dockerfile, context: Path, rootfs: Path) -> None:
    """Do the Dockerfile's COPY instructions from `context` into `rootfs` (the image's /)."""
    excluded = dockerignore(context)

    def ignore(directory: str, names: list[str]) -> set[str]:
        base = Path(directory).relative_to(context).as_posix()
        return {name for name in names if excluded(posixpath.normpath(posixpath.join(base, name)))}

    for sources, destination in dockerfile.copies:
        target = rootfs / destination.lstrip("/")
        into_directory = destination.endswith("/") or len(sources) > 1
        for source in sources:
            matches = [path for path in sorted(context.glob(source)) if not excluded(path.relative_to(context).as_posix())]
            assert matches, f"COPY {source}: not in the build context (missing, or left out by .dockerignore)"
            for path in matches:
                if path.is_dir():
                    shutil.copytree(path, target, ignore=ignore, dirs_exist_ok=True)
                else:
                    file_target = target / path.name if into_directory else target
                    file_target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, file_target)


def copy_source_tree(destination: Path) -> Path:
    """The checkout as a clean clone has it (no venv, caches or build output), to install from."""
    shutil.copytree(ROOT, destination, ignore=NOT_SOURCE)
    return destination


def _pip_env() -> dict[str, str]:
    """This environment (proxies, pip's index settings) without what would leak the checkout in."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path


def pip_install(venv: Path, args: Sequence[str], cwd: Path) -> None:
    """`pip install args` into the venv; pip's cache is used (the image's --no-cache-dir only
    keeps the cache out of its layer)."""
    args = [arg for arg in args if arg != "--no-cache-dir"]
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        cwd=cwd,
        env=_pip_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def product_env(venv: Path, home: Path, **extra: str) -> dict[str, str]:
    """A bare environment in which `keel` and `python` are the venv's, as /usr/local/bin's in the image."""
    return {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **extra}


def listed_commands(help_text: str) -> set[str]:
    """The commands `keel --help` lists (argparse's block under COMMAND)."""
    _, found, block = help_text.partition("\n  COMMAND\n")
    assert found, help_text
    names = set()
    for line in block.splitlines():
        if not line.strip():
            break
        if match := re.match(r" {4}(\S+)", line):
            names.add(match[1])
    return names
