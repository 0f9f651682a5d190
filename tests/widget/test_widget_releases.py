"""Immutable widget releases (docs/widget.md, versions): a past release is
served from its frozen copies, bytes the manifest did not record are never
served, and cutting a release freezes the current one (still served) and
makes the sources the new current one. Each test works on a copy of the
sources and of the manifest in a temporary directory."""
from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from widget import assets, releases

pytestmark = pytest.mark.django_db

WIDGET = "owllayer-widget.js"


@dataclass
class Tree:
    sources: Path
    releases: Path

    def git(self, *arguments: str) -> None:
        subprocess.run(["git", "-c", "user.name=Release", "-c", "user.email=release@example.com",
                        "-C", str(self.sources), *arguments], check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Tree:
    """The widget's sources as release 1.0.0, in a temporary directory."""
    found = Tree(sources=tmp_path / "static" / "owllayer", releases=tmp_path / "releases")
    found.sources.mkdir(parents=True)
    found.releases.mkdir()
    for name in releases.FILES:
        shutil.copyfile(releases.SOURCES / name, found.sources / name)
    monkeypatch.setattr(releases, "SOURCES", found.sources)
    monkeypatch.setattr(releases, "RELEASES", found.releases)
    releases.save(releases.Manifest(current="1.0.0", releases={"1.0.0": releases.source_hashes()}))
    return found


def change(path: Path, line: bytes = b"// changed\n") -> bytes:
    body = path.read_bytes() + line
    path.write_bytes(body)
    return body


def test_a_past_release_is_served_from_its_frozen_copies_and_the_current_one_from_the_sources(tree, client):
    frozen = tree.releases / "0.9.0"
    frozen.mkdir()
    for name in releases.FILES:
        shutil.copyfile(tree.sources / name, frozen / name)
    old_widget = change(frozen / WIDGET, b"// release 0.9.0\n")
    manifest = releases.load()
    releases.save(releases.Manifest(current="1.0.0", releases={
        **manifest.releases, "0.9.0": {name: releases.integrity_of((frozen / name).read_bytes())
                                       for name in releases.FILES}}))

    past = client.get(f"/widget/0.9.0/{WIDGET}")
    assert past.status_code == 200
    assert past.content == old_widget
    assert past["ETag"] == '"' + releases.integrity_of(old_widget).removeprefix("sha384-") + '"'
    assert past["Cache-Control"] == "public, max-age=31536000, immutable"
    assert client.get(f"/widget/1.0.0/{WIDGET}").content == (tree.sources / WIDGET).read_bytes()
    assert client.get(f"/widget/v1/{WIDGET}")["Location"] == f"/widget/1.0.0/{WIDGET}"
    assert client.get(f"/widget/v0/{WIDGET}")["Location"] == f"/widget/0.9.0/{WIDGET}"


def test_bytes_the_manifest_did_not_record_are_not_served_and_the_log_says_so_once(tree, client, caplog):
    change(tree.sources / WIDGET)
    frozen = tree.releases / "0.9.0"
    frozen.mkdir()
    manifest = releases.load()
    releases.save(releases.Manifest(current="1.0.0", releases={**manifest.releases, "0.9.0": {
        WIDGET: releases.integrity_of(b"the recorded bytes")}}))
    (frozen / WIDGET).write_bytes(b"other bytes")
    with caplog.at_level(logging.ERROR, logger="widget.assets"):
        assert client.get(f"/widget/1.0.0/{WIDGET}").status_code == 404
        assert client.get(f"/widget/1.0.0/{WIDGET}").status_code == 404
        assert client.get(f"/widget/v1/{WIDGET}").status_code == 404
        assert client.get(f"/widget/0.9.0/{WIDGET}").status_code == 404
    said = [record.getMessage() for record in caplog.records if record.name == "widget.assets"]
    assert len(said) == 2, said
    assert said[0].startswith(f"widget 1.0.0: not serving {tree.sources / WIDGET}: its bytes are not the ones")
    assert "cut a new release: make widget-release RELEASE=x.y.z" in said[0]
    assert said[1] == (f"widget 0.9.0: not serving {frozen / WIDGET}: its bytes are not the ones release 0.9.0"
                       " recorded; restore the release's frozen copy from git")
    # The other files of the release are still the recorded ones.
    assert client.get("/widget/1.0.0/owllayer-client.js").status_code == 200


def test_cutting_a_release_freezes_the_current_one_still_served_and_makes_the_new_one_current(
        tree, client, rf, capsys):
    original = (tree.sources / WIDGET).read_bytes()
    tree.git("init", "-q")
    tree.git("add", ".")
    tree.git("commit", "-q", "-m", "release 1.0.0")
    changed = change(tree.sources / WIDGET)
    assert releases.changed_files(releases.load()) == [WIDGET]

    assert releases.main(["1.1.0"]) == 0

    said = capsys.readouterr().out
    assert said == "widget release 1.1.0 is current; 1.0.0 stays served from widget/releases/1.0.0/\n"
    manifest = releases.load()
    assert manifest.current == "1.1.0"
    assert manifest.releases["1.1.0"] == releases.source_hashes()
    assert releases.changed_files(manifest) == []
    assert sorted(path.name for path in (tree.releases / "1.0.0").iterdir()) == sorted(releases.FILES)
    # The old release: its recorded bytes (the widget's from git), still served.
    old = client.get(f"/widget/1.0.0/{WIDGET}")
    assert old.status_code == 200
    assert old.content == original
    assert client.get("/widget/1.0.0/owllayer-client.js").content == (tree.sources / "owllayer-client.js").read_bytes()
    # The new one is what the snippet and /widget/v1/ name.
    assert client.get(f"/widget/1.1.0/{WIDGET}").content == changed
    assert client.get(f"/widget/v1/{WIDGET}")["Location"] == f"/widget/1.1.0/{WIDGET}"
    snippet = assets.embed_snippet(rf.get("/", HTTP_HOST="testserver"), "pk_live_abc")
    assert f'src="http://testserver/widget/1.1.0/{WIDGET}"' in snippet
    assert f'integrity="{releases.integrity_of(changed)}"' in snippet


@pytest.mark.parametrize("release, refusal", [
    ("1.0.0", "release 1.0.0 must be newer than 1.0.0, the current one"),
    ("0.9.9", "release 0.9.9 must be newer than 1.0.0, the current one"),
    ("v2", "a release is named like 1.2.3, not 'v2'"),
    ("1.1", "a release is named like 1.2.3, not '1.1'"),
])
def test_a_release_must_be_named_like_1_2_3_and_newer_than_the_current_one(tree, release, refusal):
    change(tree.sources / WIDGET)
    with pytest.raises(releases.ReleaseError) as refused:
        releases.cut(release)
    assert str(refused.value) == refusal


def test_no_release_is_cut_from_unchanged_sources_or_without_the_current_releases_bytes(tree, capsys):
    assert releases.main(["1.0.1"]) == 1
    assert "the sources are release 1.0.0's bytes: there is nothing to release" in capsys.readouterr().err
    # Changed, and never committed: the bytes of 1.0.0's widget are nowhere.
    change(tree.sources / WIDGET)
    with pytest.raises(releases.ReleaseError, match=f"no version of {WIDGET} in the sources or their git history"):
        releases.cut("1.0.1")
    assert releases.load().current == "1.0.0"
