"""The widget's releases (docs/widget.md, versions).

A release is a name like ``1.0.0`` and, for each of its files, the
Subresource Integrity hash of its bytes. The manifest,
``widget/releases/manifest.json``, records every release still served and
which one is current. The current release is served from the sources in
static/owllayer/; a past one from the copies frozen under
``widget/releases/<release>/`` when the next one was cut. Whatever is served
must be the bytes the manifest recorded (widget/assets.py checks).

Cutting a release (``make widget-release RELEASE=x.y.z``, which runs this
module) freezes the current release's files, records the sources' hashes as
the new release and makes it current. The current release's bytes are found
in the sources when unchanged, otherwise in the sources' git history: the
frozen copy is always the bytes the manifest recorded.

Django-free, so that the release step runs without settings.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# Read at each use, so that a test can point them at a temporary directory.
SOURCES = PACKAGE.parent / "static" / "owllayer"
RELEASES = PACKAGE / "releases"
MANIFEST_NAME = "manifest.json"

# The files of a release: the widget, the modules it imports (the voice
# worklet is the client's, loaded only when a page opens the microphone) and
# the type declarations of its API.
FILES = ("owllayer-widget.js", "owllayer-client.js", "owllayer-markdown.js",
         "owllayer-voice-worklet.js", "owllayer-widget.d.ts")
RELEASE_NAME = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
CHANGED = "the widget's files changed: cut a new release: make widget-release RELEASE=x.y.z (docs/widget.md)"


class ReleaseError(Exception):
    """A release that cannot be cut, in words for the person cutting it."""


@dataclass(frozen=True)
class Manifest:
    current: str
    releases: dict[str, dict[str, str]]  # release -> file name -> "sha384-..."

    def latest_of_major(self, major: int) -> str | None:
        """The newest release of a major version (what /widget/v<major>/ serves)."""
        of_major = [name for name in self.releases if parse(name)[0] == major]
        return max(of_major, key=parse, default=None)


def integrity_of(body: bytes) -> str:
    """The hash as a script tag's integrity attribute takes it."""
    return "sha384-" + base64.b64encode(hashlib.sha384(body).digest()).decode("ascii")


def parse(release: str) -> tuple[int, int, int]:
    found = RELEASE_NAME.match(release)
    if found is None:
        raise ReleaseError(f"a release is named like 1.2.3, not {release!r}")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def manifest_of(text: str | bytes) -> Manifest:
    data = json.loads(text)
    return Manifest(current=data["current"], releases=data["releases"])


def load(releases: Path | None = None) -> Manifest:
    return manifest_of(((releases or RELEASES) / MANIFEST_NAME).read_bytes())


def save(manifest: Manifest, releases: Path | None = None) -> None:
    data = {"current": manifest.current, "releases": manifest.releases}
    ((releases or RELEASES) / MANIFEST_NAME).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def source_hashes(sources: Path | None = None) -> dict[str, str]:
    return {name: integrity_of(((sources or SOURCES) / name).read_bytes()) for name in FILES}


def changed_files(manifest: Manifest, sources: Path | None = None) -> list[str]:
    """The files whose sources are not the current release's recorded bytes."""
    recorded = manifest.releases[manifest.current]
    return sorted(name for name, integrity in source_hashes(sources).items() if recorded.get(name) != integrity)


def _git(sources: Path, *arguments: str) -> bytes | None:
    try:
        done = subprocess.run(["git", "-C", str(sources), *arguments], capture_output=True, timeout=60, check=False)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def recorded_bytes(name: str, integrity: str, sources: Path) -> bytes:
    """The bytes of `name` whose hash is `integrity`: the source's, or a
    committed version of it."""
    body = (sources / name).read_bytes() if (sources / name).exists() else b""
    if integrity_of(body) == integrity:
        return body
    commits = (_git(sources, "log", "--format=%H", "--", name) or b"").decode().split()
    for commit in commits:
        body = _git(sources, "show", f"{commit}:./{name}") or b""
        if integrity_of(body) == integrity:
            return body
    raise ReleaseError(f"no version of {name} in the sources or their git history has the hash {integrity}")


def cut(new: str, *, sources: Path | None = None, releases: Path | None = None) -> Manifest:
    """Freeze the current release's files, make the sources release `new`."""
    sources, releases = sources or SOURCES, releases or RELEASES
    manifest = load(releases)
    if new in manifest.releases or parse(new) <= parse(manifest.current):
        raise ReleaseError(f"release {new} must be newer than {manifest.current}, the current one")
    if not changed_files(manifest, sources):
        raise ReleaseError(f"the sources are release {manifest.current}'s bytes: there is nothing to release")
    old = manifest.current
    frozen = releases / old
    frozen.mkdir(parents=True, exist_ok=True)
    for name, integrity in manifest.releases[old].items():
        (frozen / name).write_bytes(recorded_bytes(name, integrity, sources))
    cut_manifest = Manifest(current=new, releases={**manifest.releases, new: source_hashes(sources)})
    save(cut_manifest, releases)
    return cut_manifest


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make widget-release RELEASE=x.y.z", file=sys.stderr)
        return 2
    try:
        old = load().current
        cut(argv[0])
    except ReleaseError as error:
        print(f"widget release: {error}", file=sys.stderr)
        return 1
    print(f"widget release {argv[0]} is current; {old} stays served from widget/releases/{old}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
