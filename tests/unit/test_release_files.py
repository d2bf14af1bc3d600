"""The files users look for agree with each other and with the package: one version in pyproject.toml,
`pipeline.__version__`, CITATION.cff and the newest release of CHANGELOG.md; one licence in
pyproject.toml, CITATION.cff and LICENSE (the full Apache License 2.0 text)."""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path

import yaml

import pipeline

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra installs tomli there (tomllib is tomli, taken into the standard library)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _citation() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))


def _releases() -> list[tuple[str, str | None]]:
    """(version, date or None) of every `## [x.y.z]` heading of CHANGELOG.md, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^## \[(\d+\.\d+\.\d+)\](?: - (\S+))?$", text, re.M)]


def test_one_version_everywhere():
    version = _pyproject()["version"]
    assert pipeline.__version__ == version
    assert str(_citation()["version"]) == version
    assert _releases()[0][0] == version


def test_the_newest_release_is_dated_as_the_citation_says():
    cff = _citation()
    released = str(cff["date-released"])
    datetime.date.fromisoformat(released)
    assert _releases()[0][1] == released


def test_the_changelog_keeps_its_format():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in text and "keepachangelog.com" in text
    newest = text.split(f"## [{_releases()[0][0]}]", 1)[1].split("\n## [", 1)[0]
    assert {"### Added", "### Changed", "### Fixed"} <= set(re.findall(r"^### \w+", newest, re.M))


def test_the_citation_is_valid_cff():
    cff = _citation()
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors"):
        assert cff.get(key), key
    assert all(isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in cff["authors"])
    assert set(cff) <= {"cff-version", "message", "type", "title", "abstract", "authors", "version", "date-released",
                        "license", "keywords", "repository-code", "url", "doi", "identifiers", "references",
                        "preferred-citation", "commit", "contact", "license-url", "repository", "repository-artifact"}


def test_one_licence_everywhere():
    license_ = _pyproject()["license"]
    declared = license_["text"] if isinstance(license_, dict) else license_
    assert declared == "Apache-2.0" and _citation()["license"] == declared
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    # the whole text: the nine sections of the terms, their end, and the appendix
    for n, title in enumerate(["Definitions", "Grant of Copyright License", "Grant of Patent License", "Redistribution",
                               "Submission of Contributions", "Trademarks", "Disclaimer of Warranty",
                               "Limitation of Liability", "Accepting Warranty or Additional Liability"], 1):
        assert f"{n}. {title}." in text, title
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
